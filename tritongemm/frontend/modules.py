"""The modules: ``Linear`` (a ``torch.nn.Linear`` on tritongemm's GEMMs), ``Float8Linear`` (fp8 training)
and ``GatedMLP`` (a GLU MLP whose gate and up projections and product are one kernel); ``tritongemm.nn``
(``frontend/nn.py``) presents them with ``convert``."""

from __future__ import annotations

import warnings
from collections import Counter

import torch
from torch.nn.functional import linear as torch_linear

from ..autograd.distributed import is_dtensor, linear_on_shards
from ..autograd.function import is_tracing
from ..request import calls, fastpath
from ..request.autocast import autocast_dtype
from ..request.fallback import count_fallback, torch_reason, traced_reason
from ..semantics import ACTIVATIONS
from .float8 import WeightCache, float8_linear, float8_unsupported_reason
from .gated import check_gated_activation, gated_linear, torch_gated


class Linear(torch.nn.Linear):
    """Drop-in ``torch.nn.Linear`` computed by tritongemm, with an optional fused activation.

    >>> layer = tritongemm.nn.Linear(4096, 11008, bias=False, device="cuda", dtype=torch.bfloat16)
    >>> up = tritongemm.nn.Linear(4096, 14336, activation="gelu")   # Linear + bias + GELU in one kernel

    ``layer.fallbacks`` counts, by reason, the calls of this module that went
    to torch; ``Linear.fallbacks`` (on the class) counts those of all instances.
    """

    #: Reasons inputs were handed to torch instead, summed over all instances
    #: (each instance's own counts shadow this name on the instance).
    fallbacks: Counter = Counter()

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        activation: str | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation or "none"
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Linear: unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
        self.fallbacks = Counter()

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation != "none" else ""
        return super().extra_repr() + act + ", backend=tritongemm"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._linear(input, self.weight, self.bias)

    def _linear(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """This layer's function of ``input`` with these parameters (its own, or a DTensor's shards of them)."""
        if self.activation == "none" or not calls.records_grad(input, weight, bias):
            # A repeated call: its entry was made by a call that passed every check ((None, None) at
            # once for a DTensor or a trace).  An activation's entries run without autograd only.
            kind = "linear" if self.activation == "none" else fastpath.linear_kind(self.activation)
            key, y = fastpath.lookup(kind, input, weight, bias)
            if y is not None:
                return y
        else:  # recorded: the plain linear's entry, then torch's activation, as the whole way does
            key = None
            _, y = fastpath.lookup("linear", input, weight, bias)
            if y is not None:
                return ACTIVATIONS[self.activation](y)
        if torch.compiler.is_compiling() and not is_dtensor(input):
            y = calls.traced_linear(input, weight, bias, self.activation)  # (a few of Dynamo's steps)
            if y is not None:
                return y
        if is_dtensor(input):  # tensor parallelism: one GEMM of the shards where no redistribution is needed
            y = linear_on_shards(self._linear, input, weight, bias, self.activation)
            if y is not None:
                return y
        tensors = (input, weight) if bias is None else (input, weight, bias)
        if not is_tracing(input) or is_dtensor(input):
            reason = torch_reason(*tensors)
            if reason is not None:
                count_fallback("tritongemm.nn.Linear", reason, (self.fallbacks, Linear.fallbacks), input)
                return ACTIVATIONS[self.activation](torch_linear(input, weight, bias))
        elif traced_reason(*tensors) is not None:  # (a trace: torch's op in the graph, as eagerly)
            return ACTIVATIONS[self.activation](torch_linear(input, weight, bias))
        # ``tritongemm.linear``'s whole way (the lookup above was its door's)
        return calls.linear(input, weight, bias, self.activation, None, None, None, None, None, key)

    def _torch_forward(self, input: torch.Tensor, weight, bias, reason: str) -> torch.Tensor:
        count_fallback("tritongemm.nn.Linear", reason, (self.fallbacks, Linear.fallbacks), input)
        return ACTIVATIONS[self.activation](torch_linear(input, weight, bias))

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if "fallbacks" not in self.__dict__:  # pickled before counts were per instance
            self.fallbacks = Counter()

    @classmethod
    def from_linear(cls, module: torch.nn.Linear) -> Linear:
        """A ``Linear`` that takes over ``module``'s state: the same objects, not copies.

        Parameters, buffers, hooks (forward, pre-forward, backward, state-dict
        ones, with their removal handles still working), the training flag and
        any attributes set on the instance carry over.  The two modules share
        their parameter, buffer and hook dictionaries, so use the new one from
        then on.
        """
        return _take_over(cls, module)


def _take_over(cls: type, module: torch.nn.Module, activation: str = "none", **own):
    """A ``cls`` (``Linear``, ``Conv1D``, ``GatedMLP``) with ``module``'s state: the same objects, not copies;
    ``activation``, fresh ``fallbacks`` and ``own``'s attributes are its own."""
    new = cls.__new__(cls)
    # Sharing the instance dictionary's values keeps every hook registered on
    # `module`, in whatever dictionaries this torch version keeps them, and
    # keeps the handles torch returned valid (they point at those dictionaries).
    new.__dict__.update(module.__dict__)
    what = type(module).__name__
    for name in ("activation", "fallbacks", *own):
        if name in module.__dict__:
            warnings.warn(
                f"tritongemm.nn.convert: the attribute {name!r} set on {what} is replaced by "
                f"tritongemm.nn.{cls.__name__}'s own {name!r}",
                stacklevel=4,
            )
    new.__dict__.update(activation=activation, fallbacks=Counter(), **own)
    if new.__dict__.get("_compiled_call_impl") is not None:
        # Module.compile() compiled the old module's call: it would keep running torch.
        new.__dict__["_compiled_call_impl"] = None
        warnings.warn(
            f"tritongemm.nn.convert: {what} was compiled with Module.compile(); call compile() "
            "again on the converted module",
            stacklevel=4,
        )
    return new


class Conv1D(torch.nn.Module):
    """transformers' ``Conv1D`` -- GPT-2's projections, ``x @ weight + bias`` with ``weight`` stored
    (in, out) -- computed by tritongemm, with an optional fused activation.

    ``convert`` makes these from transformers' (``from_conv1d``): the same parameters, so ``state_dict``
    keys and shapes are unchanged, and the same hooks.  The GEMM is ``Linear``'s on ``weight.mT`` (fast
    path, autograd, ``torch.compile`` and fallbacks alike; fallbacks are counted with ``Linear``'s).
    It is no ``torch.nn.Linear``: its weight is the transpose of one.
    """

    def __init__(self, nf: int, nx: int, device=None, dtype=None, *, activation: str | None = None) -> None:
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = torch.nn.Parameter(torch.empty(nx, nf, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(nf, device=device, dtype=dtype))
        torch.nn.init.normal_(self.weight, std=0.02)  # (transformers' initialisation)
        self.activation = activation or "none"
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Conv1D: unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
        self.fallbacks = Counter()

    _linear = Linear._linear

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._linear(input, self.weight.mT, self.bias)

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation != "none" else ""
        return f"nf={self.weight.shape[1]}, nx={self.weight.shape[0]}{act}, backend=tritongemm"

    @classmethod
    def from_conv1d(cls, module: torch.nn.Module) -> Conv1D:
        """A ``Conv1D`` that takes over transformers' ``module``'s state (as ``Linear.from_linear`` does)."""
        return _take_over(cls, module)


class FusedActivation(torch.nn.Identity):
    """An activation module ``convert`` fused into the Linear before it (``into``, a sibling's name):
    it passes its input on, since that Linear's output is already activated.

    >>> model.encoder.layer[0].intermediate
    BertIntermediate(
      (dense): Linear(in_features=768, out_features=3072, bias=True, activation='gelu', backend=tritongemm)
      (intermediate_act_fn): FusedActivation(gelu, fused into dense)
    )
    """

    def __init__(self, activation: str, into: str) -> None:
        super().__init__()
        self.activation = activation
        self.into = into

    def extra_repr(self) -> str:
        return f"{self.activation}, fused into {self.into}"


class Float8Linear(Linear):
    """A ``Linear`` whose forward and backward GEMMs run in fp8 with dynamic scales (``float8``).

    The parameters stay in their dtype; the output is in the input's dtype (autocast's under
    ``torch.autocast``).  ``recipe``: "rowwise" (default), "tensorwise" or "blockwise" scales.  ``fast_accum``:
    whether the forward GEMM sums in the tensor cores' accumulator (default, as torchao's; the
    gradient GEMMs always sum in fp32).  Made by ``convert(model, precision="fp8")`` for layers
    whose in and out features are multiples of 16.
    """

    recipe: str = "rowwise"
    fast_accum: bool = True

    def extra_repr(self) -> str:
        accum = "" if self.fast_accum else ", fast_accum=False"
        return super().extra_repr() + f", precision='fp8', recipe={self.recipe!r}" + accum

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        tensors = (input, self.weight) if self.bias is None else (input, self.weight, self.bias)
        if not is_tracing(input) or is_dtensor(input):
            reason = torch_reason(*tensors)
            if reason is not None:
                return self._torch_forward(input, self.weight, self.bias, reason)
        elif traced_reason(*tensors) is not None:
            return ACTIVATIONS[self.activation](torch_linear(input, self.weight, self.bias))
        if float8_unsupported_reason(input, self.weight) is not None:
            return super().forward(input)
        out_dtype = autocast_dtype(input.device) or input.dtype
        y = float8_linear(
            input, self.weight, self.bias, self.recipe, out_dtype, self._weight8, self.fast_accum
        )
        return ACTIVATIONS[self.activation](y)

    @property
    def _weight8(self) -> WeightCache:
        """The fp8 copies of this layer's weight (made on first use, not saved with the state)."""
        cache = self.__dict__.get("_weight8_cache")
        if cache is None:
            cache = self.__dict__["_weight8_cache"] = WeightCache()
        return cache

    @classmethod
    def from_linear(
        cls, module: torch.nn.Linear, recipe: str = "rowwise", fast_accum: bool = True
    ) -> Float8Linear:
        new = super().from_linear(module)
        new.__dict__["recipe"] = recipe
        new.__dict__["fast_accum"] = fast_accum
        return new


#: Below this many multiply-adds in each of the gate and up projections (x's elements times the
#: intermediate width), ``GatedMLP`` runs its three Linears instead of the gated kernel: the GEMMs
#: then take about as long as the fused path's extra host time per call (H100, eager, the models
#: suite's small Llama, 512 x 1408 x 512: 0.95 of stock fused; Llama-3-8B layers, 4096 x 14336 x
#: 4096: 1.05).  Under CUDA graph capture host time is not replayed: fused at any size.  A compiled
#: graph keeps the same threshold (its mode, and so whether CUDA graphs replay it, is not known while tracing).
FUSED_MIN_MACS = 2**32
#: In a compiled graph the gated kernel is one opaque call, with host time of its own, where the stock
#: graph has two GEMMs and one fused pass; its GPU saving grows with ``h``'s size (tokens x intermediate
#: width), its host time does not.  Below this many elements of ``h`` a compiled ``GatedMLP`` traces its
#: three Linears (H100, compiled default mode, bf16 prefill, ÷ compiled stock: the gated op read 0.81
#: and 0.85 at 8.4M and 14.7M elements, 1.04 and 1.02 at 33.6M and 58.7M: compile.md).
COMPILED_FUSED_MIN_OUTPUTS = 2**25


def _hooked(module: torch.nn.Module) -> bool:
    """Has ``module`` hooks that run when it is called?"""
    return bool(
        module._forward_pre_hooks
        or module._forward_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


class GatedMLP(torch.nn.Module):
    """A GLU MLP, ``down_proj(act(gate_proj(x)) * up_proj(x))``, its first half in one kernel.

    >>> mlp = tritongemm.nn.GatedMLP(4096, 14336, activation="silu", device="cuda", dtype=torch.bfloat16)
    >>> y = mlp(x)        # down_proj(gated_linear(x, gate_proj.weight, up_proj.weight, ...))

    ``gate_proj``, ``up_proj`` and ``down_proj`` are tritongemm ``Linear`` modules (so ``state_dict``
    keys are those of a Llama-style MLP); ``activation`` is "silu" (SwiGLU), "gelu_tanh" (GeGLU,
    Gemma's) or "gelu".  The gated kernel computes ``gate_proj`` and ``up_proj`` without calling
    them as modules; where either has hooks (put on after ``convert``, which leaves an MLP with such
    hooks alone: ``parallelize_module``'s, say), the three are called as modules instead, so the
    hooks run.  Inputs tritongemm cannot run go to torch's ops, counted by reason in ``fallbacks`` as
    ``Linear`` counts them.
    ``convert`` makes these from the models' own MLPs (``from_module``).

    Under ``torch.compile``, inference with fewer than ``compiled_min_outputs`` elements of ``h`` traces
    the three Linears (a class attribute, ``COMPILED_FUSED_MIN_OUTPUTS``; set it to 0 on an instance or
    the class to keep the gated kernel at every size, the better choice under CUDA graphs
    (``mode="reduce-overhead"``), which replay no host time).
    """

    compiled_min_outputs: int = COMPILED_FUSED_MIN_OUTPUTS

    #: Reasons inputs were handed to torch instead, summed over all instances (as ``Linear.fallbacks``).
    fallbacks: Counter = Counter()

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool = False,
        activation: str = "silu",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.activation = check_gated_activation("GatedMLP", activation)
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=bias, device=device, dtype=dtype)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias, device=device, dtype=dtype)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias, device=device, dtype=dtype)
        self.fallbacks = Counter()

    def extra_repr(self) -> str:
        source = self.__dict__.get("fused_from")
        return f"activation={self.activation!r}" + (f", fused from {source}" if source else "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj, self.up_proj
        if _hooked(gate) or _hooked(up):
            # Hooks added after convert (``parallelize_module``'s, which make the inputs DTensors) run
            # only when the projections are called: call them.
            return self.down_proj(ACTIVATIONS[self.activation](gate(x)) * up(x))
        traced = is_tracing(x) and not is_dtensor(x)
        tensors = tuple(t for t in (x, gate.weight, up.weight, gate.bias, up.bias) if t is not None)
        if not traced:
            reason = torch_reason(*tensors)
            if reason is not None:
                return self._torch_forward(x, reason)
        elif traced_reason(*tensors) is not None:
            return self.down_proj(torch_gated(x, gate.weight, up.weight, gate.bias, up.bias, self.activation))
        if traced:
            # A compiled graph: small, the Linears are the stock model's ops (an aligned Linear traces
            # to aten), which Inductor fuses around, where the gated op would be one opaque call with
            # host time of its own.  Training, at any size: Inductor fuses the product and its
            # gradient into the GEMMs' neighbours, and the gated kernel's backward lost to that (H100,
            # Llama-3-8B layers, a compiled training step: 0.955 of stock's with it).
            small = x.numel() * gate.out_features < self.compiled_min_outputs * gate.in_features
            unfused = small or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        else:
            small = x.numel() * gate.out_features < FUSED_MIN_MACS
            # Host-bound: the Linears' fast paths (C++ key and backward node) cost less per call.
            unfused = small and not (x.is_cuda and torch.cuda.is_current_stream_capturing())
        if unfused:
            act = ACTIVATIONS[self.activation]
            return self.down_proj(act(gate(x)) * up(x))
        return self.down_proj(
            gated_linear(x, gate.weight, up.weight, gate.bias, up.bias, activation=self.activation)
        )

    def _torch_forward(self, x: torch.Tensor, reason: str) -> torch.Tensor:
        count_fallback("tritongemm.nn.GatedMLP", reason, (self.fallbacks, GatedMLP.fallbacks), x)
        gate, up = self.gate_proj, self.up_proj
        h = torch_gated(x, gate.weight, up.weight, gate.bias, up.bias, self.activation)
        return self.down_proj(h)

    @classmethod
    def from_module(cls, module: torch.nn.Module, activation: str) -> GatedMLP:
        """A ``GatedMLP`` that takes over ``module``'s state: the same objects, not copies.

        As ``Linear.from_linear``: submodules, parameters, buffers, hooks (their handles still
        working), the training flag and the instance's attributes (``config``, ``act_fn``, ...)
        carry over, and the two modules share those dictionaries, so use the new one from then
        on.  ``module`` must compute ``down_proj(act(gate_proj(x)) * up_proj(x))`` with this
        ``activation`` (``fusion.gated_mlp_activation`` says whether it does); its projections
        are not converted here (``convert`` does that).
        """
        activation = check_gated_activation("GatedMLP", activation)
        return _take_over(cls, module, activation, fused_from=type(module).__name__)
