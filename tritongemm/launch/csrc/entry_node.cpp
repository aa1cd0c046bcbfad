// The autograd node of a fast-path entry (tritongemm/fastpath.py), in C++,
// the entry's autocast casts, and the key a call looks its entry up by.
//
// `record(out, x, w, bias, entry)` gives `out` -- already computed by the
// entry's launch under no grad -- a grad_fn whose backward calls
// `entry.backward(needs, g, x, w)` in Python, exactly as the Python
// `fastpath.EntryFunction` does.  What it saves is recording: a Python
// `autograd.Function` spends ~3 us per call on its context object, argument
// unpacking and output wrapping; this spends well under one.
//
// `cast(dtype, x, w, bias)` casts an entry's operands under torch.autocast
// as torch's own matmul-family ops do, through at::autocast::cached_cast: the
// same eligibility rules and the same per-region cache of fp32 leaf weights
// (a weight used twice in one autocast region is cast once, and one cast is
// saved for backward, not one per use).  A cast costs the same from either
// side (~11 us on the H100's host); where the weight's and the
// bias's casts come from the cache, this takes ~9.5 us for what three
// `Tensor.to` calls from Python take ~38.
//
// `signature(kind, x, w, bias, precision)` is fastpath.signature's key in one
// call: the tensors' shapes, strides, dtypes, devices, 16-byte alignment and
// negation bits packed into one bytes object (~1.8 us of Python attribute
// reads and tuples per call otherwise).
//
// Plain CPython API (METH_FASTCALL), no pybind11: argument conversion through
// pybind costs more than the Python node this replaces.  Built on first use by
// tritongemm/native.py; where it cannot be built, EntryFunction is used.
#include <Python.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include <type_traits>

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;
// std::shared_ptr<Node> up to torch 2.12, c10::intrusive_ptr<Node> after.
using NodePtr = std::remove_cv_t<decltype(torch::autograd::Edge::function)>;

PyObject* backward_name = nullptr;  // interned "backward"

struct EntryBackward final : public Node {
  PyObject* entry = nullptr;  // strong reference to the fastpath.Entry
  SavedVariable x, w;         // x when w needs a gradient, w when x does

  ~EntryBackward() override {
    if (entry != nullptr && Py_IsInitialized()) {
      PyGILState_STATE state = PyGILState_Ensure();
      Py_DECREF(entry);
      PyGILState_Release(state);
    }
  }

  std::string name() const override { return "TritongemmEntryBackward"; }

  void release_variables() override {
    x.reset_data();
    w.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    variable_list result(3);
    if (!grads[0].defined()) {
      return result;  // a zero gradient: every input's is zero too
    }
    const bool needs[3] = {task_should_compute_output(0), task_should_compute_output(1),
                           task_should_compute_output(2)};
    // Unpacking checks the saved tensors' versions (in-place changes) and
    // raises after release (a second backward without retain_graph).
    at::Tensor xs = x.unpack();
    at::Tensor ws = w.unpack();
    PyGILState_STATE state = PyGILState_Ensure();
    PyObject* out = nullptr;
    {
      PyObject* py_needs = PyTuple_Pack(3, needs[0] ? Py_True : Py_False, needs[1] ? Py_True : Py_False,
                                        needs[2] ? Py_True : Py_False);
      PyObject* g = THPVariable_Wrap(grads[0]);
      PyObject* px = xs.defined() ? THPVariable_Wrap(xs) : Py_NewRef(Py_None);
      PyObject* pw = ws.defined() ? THPVariable_Wrap(ws) : Py_NewRef(Py_None);
      if (py_needs && g && px && pw) {
        out = PyObject_CallMethodObjArgs(entry, backward_name, py_needs, g, px, pw, nullptr);
      }
      Py_XDECREF(py_needs);
      Py_XDECREF(g);
      Py_XDECREF(px);
      Py_XDECREF(pw);
    }
    if (out != nullptr && (!PyTuple_Check(out) || PyTuple_GET_SIZE(out) != 3)) {
      Py_DECREF(out);
      out = nullptr;
      PyErr_SetString(PyExc_TypeError, "Entry.backward must return a tuple of 3 gradients");
    }
    for (Py_ssize_t i = 0; out != nullptr && i < 3; ++i) {
      PyObject* item = PyTuple_GET_ITEM(out, i);
      if (item == Py_None) {
        continue;
      }
      if (!THPVariable_Check(item)) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_TypeError, "Entry.backward returned a gradient that is not a tensor");
        break;
      }
      result[i] = THPVariable_Unpack(item);
    }
    if (out == nullptr) {
      python_error error;
      error.persist();  // holds the Python exception for the engine to re-raise
      PyGILState_Release(state);
      throw std::move(error);
    }
    Py_DECREF(out);
    PyGILState_Release(state);
    return result;
  }
};

template <class T>
std::shared_ptr<Node> make_node(std::shared_ptr<Node>*) {
  return std::shared_ptr<Node>(new T());
}

template <class T, class P>
P make_node(P*) {
  return c10::make_intrusive<T>();
}

bool has_forward_grad(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }

// record(out, x, w, bias, entry) -> out with a grad_fn, or None where it declines
// (forward-mode AD: the caller then takes the Python Function, which says what torch says).
PyObject* record(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 5 || !THPVariable_Check(args[0]) || !THPVariable_Check(args[1]) ||
      !THPVariable_Check(args[2]) || (args[3] != Py_None && !THPVariable_Check(args[3]))) {
    PyErr_SetString(PyExc_TypeError, "record(out, x, w, bias, entry): out, x, w tensors, bias a tensor or None");
    return nullptr;
  }
  const at::Tensor& out = THPVariable_Unpack(args[0]);
  const at::Tensor& x = THPVariable_Unpack(args[1]);
  const at::Tensor& w = THPVariable_Unpack(args[2]);
  static const at::Tensor undefined;
  const at::Tensor& bias = args[3] == Py_None ? undefined : THPVariable_Unpack(args[3]);
  if (has_forward_grad(x) || has_forward_grad(w) || has_forward_grad(bias)) {
    Py_RETURN_NONE;
  }
  const bool rx = x.requires_grad(), rw = w.requires_grad(), rb = bias.defined() && bias.requires_grad();
  if (at::GradMode::is_enabled() && (rx || rw || rb)) {
    NodePtr node = make_node<EntryBackward>(static_cast<NodePtr*>(nullptr));
    auto* entry_node = static_cast<EntryBackward*>(node.get());
    entry_node->set_next_edges(torch::autograd::collect_next_edges(x, w, bias));
    entry_node->entry = Py_NewRef(args[4]);
    if (rw) {
      entry_node->x = SavedVariable(x, /*is_output=*/false);
    }
    if (rx) {
      entry_node->w = SavedVariable(w, /*is_output=*/false);
    }
    torch::autograd::set_history(out, node);
  }
  return Py_NewRef(args[0]);
  END_HANDLE_TH_ERRORS
}

// cast(dtype, x, w, bias) -> (x, w, bias) as torch.autocast casts a matmul's operands to `dtype`
// on x's device type (bias may be None; tensors autocast leaves alone come back as they are).
PyObject* cast(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4 || !THPDtype_Check(args[0]) || !THPVariable_Check(args[1]) || !THPVariable_Check(args[2]) ||
      (args[3] != Py_None && !THPVariable_Check(args[3]))) {
    PyErr_SetString(PyExc_TypeError, "cast(dtype, x, w, bias): a torch.dtype, x and w tensors, bias a tensor or None");
    return nullptr;
  }
  const at::ScalarType to_type = reinterpret_cast<THPDtype*>(args[0])->scalar_type;
  const c10::DeviceType device_type = THPVariable_Unpack(args[1]).device().type();
  // Every cast first (they may throw), then the Python objects (they may not).
  at::Tensor casts[3];
  for (int i = 0; i < 3; ++i) {
    if (args[i + 1] != Py_None) {
      casts[i] = at::autocast::cached_cast(to_type, THPVariable_Unpack(args[i + 1]), device_type);
    }
  }
  PyObject* result = PyTuple_New(3);
  if (result == nullptr) {
    return nullptr;
  }
  for (int i = 0; i < 3; ++i) {
    PyObject* item = casts[i].defined() ? THPVariable_Wrap(std::move(casts[i])) : Py_NewRef(Py_None);
    if (item == nullptr) {
      Py_DECREF(result);
      return nullptr;
    }
    PyTuple_SET_ITEM(result, i, item);  // steals the reference
  }
  return result;
  END_HANDLE_TH_ERRORS
}

// Only dense strided tensors with storage have a key (sparse, nested: the whole way says what happens).
bool keyable(const at::Tensor& t) { return t.layout() == c10::kStrided && !t.is_nested() && t.has_storage(); }

void pack_tensor(std::vector<int64_t>& v, const at::Tensor& t) {
  v.push_back(t.dim());
  for (const int64_t size : t.sizes()) {
    v.push_back(size);
  }
  for (const int64_t stride : t.strides()) {
    v.push_back(stride);
  }
  v.push_back(static_cast<int64_t>(t.scalar_type()));
  v.push_back(static_cast<int64_t>(t.device().type()));
  v.push_back(t.device().index());
  v.push_back((reinterpret_cast<std::uintptr_t>(t.const_data_ptr()) & 15) == 0);
  v.push_back(t.is_neg());
}

// signature(kind, x, w, bias, precision) -> (kind, bytes, precision): what fastpath.signature keys by
// (its callers check the tensors' types first); None for tensors that cannot have a key.
PyObject* signature(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 5 || !THPVariable_Check(args[1]) || !THPVariable_Check(args[2]) ||
      (args[3] != Py_None && !THPVariable_Check(args[3]))) {
    PyErr_SetString(PyExc_TypeError,
                    "signature(kind, x, w, bias, precision): x and w tensors, bias a tensor or None");
    return nullptr;
  }
  const at::Tensor& x = THPVariable_Unpack(args[1]);
  const at::Tensor& w = THPVariable_Unpack(args[2]);
  if (!keyable(x) || !keyable(w) || (args[3] != Py_None && !keyable(THPVariable_Unpack(args[3])))) {
    Py_RETURN_NONE;
  }
  std::vector<int64_t> v;
  v.reserve(48);
  pack_tensor(v, x);
  pack_tensor(v, w);
  if (args[3] == Py_None) {
    v.push_back(-1);  // no bias: no tensor packs a negative dimension count
  } else {
    pack_tensor(v, THPVariable_Unpack(args[3]));
  }
  PyObject* packed =
      PyBytes_FromStringAndSize(reinterpret_cast<const char*>(v.data()), static_cast<Py_ssize_t>(v.size() * 8));
  if (packed == nullptr) {
    return nullptr;
  }
  PyObject* key = PyTuple_New(3);
  if (key == nullptr) {
    Py_DECREF(packed);
    return nullptr;
  }
  PyTuple_SET_ITEM(key, 0, Py_NewRef(args[0]));
  PyTuple_SET_ITEM(key, 1, packed);
  PyTuple_SET_ITEM(key, 2, Py_NewRef(args[4]));
  return key;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"signature", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(signature)), METH_FASTCALL,
     "signature(kind, x, w, bias, precision): fastpath.signature's key, packed."},
    {"cast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(cast)), METH_FASTCALL,
     "cast(dtype, x, w, bias): the operands as torch.autocast casts them (its weight cache included)."},
    {"record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(record)), METH_FASTCALL,
     "record(out, x, w, bias, entry): give out the entry's grad_fn; None where it declines."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_entry_node", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__entry_node(void) {
  backward_name = PyUnicode_InternFromString("backward");
  if (backward_name == nullptr) {
    return nullptr;
  }
  return PyModule_Create(&module_def);
}
