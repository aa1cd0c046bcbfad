"""Tensor parallelism: tritongemm under DTensor, two processes, gloo on the CPU (NCCL on two GPUs).

One pair of worker processes (this file, run as a script) builds each model
twice, stock and with tritongemm, shards both the same way with
``parallelize_module``, runs forward and backward, and writes what it
measured to a JSON file per rank; the tests read those files.  Running every
case in one pair of processes keeps the interpreter's start-up cost (seconds
per process) paid once.  A child that fails, or hangs past the timeout, fails
every test with its output.

On two GPUs (``@pytest.mark.gpu``) the same cases run with NCCL, one process per GPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import traceback

import pytest
import torch

WORLD = 2
TIMEOUT_S = 240
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _missing_feature() -> str | None:
    """Why this torch cannot run the cases (None when it can)."""
    if not torch.distributed.is_available():
        return "this torch was built without torch.distributed"
    try:
        from torch.distributed.tensor.experimental import register_sharding  # noqa: F401
        from torch.distributed.tensor.parallel import parallelize_module  # noqa: F401
    except ImportError as e:
        return (
            f"this torch ({torch.__version__}) lacks DTensor's register_sharding or parallelize_module: {e}"
        )
    return None


# ----------------------------------------------------------------------------------
# The worker: every case, on one rank
# ----------------------------------------------------------------------------------
class _Cases:
    """Run in each worker process; ``self.results[case]`` collects comparisons and counts."""

    def __init__(self, device: str) -> None:
        import tritongemm
        from tritongemm import launch

        self.tg = tritongemm
        self.device = torch.device(device)
        self.results: dict[str, dict] = {}
        self.launches = 0
        gemm = launch.gemm

        def counting_gemm(*args, **kwargs):
            self.launches += 1
            return gemm(*args, **kwargs)

        launch.gemm = counting_gemm  # the autograd op reads launch.gemm at call time
        # A repeated call runs its fast-path entry and skips launch.gemm: the counts above hold with
        # the fast path off, and ``mlp_repeated`` turns it on to check the entries' calls on shards.
        # The op's own repeated calls (``gemm_extern``'s kept launchers) are kept off alike.
        from tritongemm.autograd import fastpath, ops
        from tritongemm.request import fastpath as door

        ops._ExternEntry = lambda *args: None  # an entry of None: each call takes the whole way

        self.door = door  # the doors' lookup, which ENABLED turns on and off
        door.ENABLED = False
        self.entry_runs = 0
        entry_run = fastpath.Entry.run

        def counting_run(entry, *args):
            self.entry_runs += 1
            return entry_run(entry, *args)

        fastpath.Entry.run = counting_run

        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(self.device.type, (WORLD,))

    # ---- helpers -----------------------------------------------------------------
    def compare(self, case: str, what: str, out, ref) -> None:
        from torch.distributed.tensor import DTensor

        from tritongemm.testing import relative_error, tolerance

        out = out.full_tensor() if isinstance(out, DTensor) else out
        ref = ref.full_tensor() if isinstance(ref, DTensor) else ref
        entry = {"what": what, "shape": list(out.shape), "ref_shape": list(ref.shape)}
        entry["error"] = relative_error(out, ref) if out.shape == ref.shape else float("inf")
        entry["tol"] = tolerance(ref.dtype, self.device)
        self.results[case]["checks"].append(entry)

    def note(self, case: str, key: str, value) -> None:
        self.results[case][key] = value

    def run(self, name: str, fn) -> None:
        self.results[name] = {"checks": [], "error": None}
        start = self.launches
        try:
            fn(name)
        except Exception:
            self.results[name]["error"] = traceback.format_exc()
        self.results[name]["launches"] = self.launches - start

    def seeded(self, build):
        torch.manual_seed(0)
        return build().to(self.device)

    def input(self, *shape):
        torch.manual_seed(1)
        return torch.randn(*shape, device=self.device)

    def train_step(self, case: str, ref_model, tg_model, x, *, compare_params=True):
        """Forward and backward of both models on the same input: outputs, input and weight gradients."""
        x_ref = x.detach().clone().requires_grad_(True)
        x_tg = x.detach().clone().requires_grad_(True)
        try:
            y_ref = ref_model(x_ref)
        except RuntimeError as exc:  # torch's own DTensor rules, e.g. torch 2.11 on a head-sharded 4-D matmul
            self.note(
                case, "reference_unsupported", f"torch {torch.__version__} cannot run the reference: {exc}"
            )
            return
        start = self.launches
        y_tg = tg_model(x_tg)
        self.note(case, "forward_launches", self.launches - start)
        self.compare(case, "output", y_tg, y_ref)
        # A weighted sum: every output element gets its own gradient.
        torch.manual_seed(2)
        w = torch.randn(y_ref.shape, device=self.device)
        start = self.launches
        (y_tg * w).sum().backward()
        self.note(case, "backward_launches", self.launches - start)
        (y_ref * w).sum().backward()
        self.compare(case, "input grad", x_tg.grad, x_ref.grad)
        if compare_params:
            for (name, p_ref), (_, p_tg) in zip(ref_model.named_parameters(), tg_model.named_parameters()):
                self.compare(case, f"{name}.grad", p_tg.grad, p_ref.grad)

    # ---- models ------------------------------------------------------------------
    @staticmethod
    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))

    @staticmethod
    def attention():
        return _Attention(dim=32, heads=4)

    # ---- cases -------------------------------------------------------------------
    def mlp_convert(self, case):
        """nn.convert, column-wise then row-wise: two GEMMs forward, four backward."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        ref = parallelize_module(self.seeded(self.mlp), self.mesh, plan)
        tg = parallelize_module(self.tg.nn.convert(self.seeded(self.mlp)), self.mesh, plan)
        self.train_step(case, ref, tg, self.input(2, 3, 16))
        self.note(case, "fallbacks", sum(sum(c.values()) for c in self.tg.nn.fallback_counts(tg).values()))

    def mlp_repeated(self, case):
        """Repeated training steps: the shards' GEMMs run from fast-path entries, as a plain tensor's do."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        ref = parallelize_module(self.seeded(self.mlp), self.mesh, plan)
        tg = parallelize_module(self.tg.nn.convert(self.seeded(self.mlp)), self.mesh, plan)
        self.door.ENABLED = True
        start = self.entry_runs
        try:
            for _ in range(3):
                ref.zero_grad(set_to_none=True)
                tg.zero_grad(set_to_none=True)
                self.train_step(case, ref, tg, self.input(2, 3, 16))
        finally:
            self.door.ENABLED = False
        self.note(case, "entry_runs", self.entry_runs - start)

    def gated_mlp_convert(self, case):
        """A Llama MLP fused by convert, then parallelized: the projections' hooks run, each on its shards."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        class LlamaMLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gate_proj = torch.nn.Linear(16, 32, bias=False)
                self.up_proj = torch.nn.Linear(16, 32, bias=False)
                self.down_proj = torch.nn.Linear(32, 16, bias=False)
                self.act_fn = torch.nn.SiLU()

            def forward(self, x):
                return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

        plan = {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(), "down_proj": RowwiseParallel()}
        ref = parallelize_module(self.seeded(LlamaMLP), self.mesh, plan)
        converted = self.tg.nn.convert(self.seeded(LlamaMLP))
        self.note(case, "fused", type(converted).__name__)
        tg = parallelize_module(converted, self.mesh, plan)
        self.train_step(case, ref, tg, self.input(2, 3, 16))

    def mlp_fused_epilogue(self, case):
        """Fused activations: GELU in the column-wise layer's epilogue, ReLU after the row-wise layer's reduction."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        def stock():
            return torch.nn.Sequential(
                torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16), torch.nn.ReLU()
            )

        def fused():
            up = self.tg.nn.Linear(16, 32, activation="gelu")
            down = self.tg.nn.Linear(32, 16, activation="relu")
            return torch.nn.Sequential(up, down)

        ref = parallelize_module(
            self.seeded(stock), self.mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()}
        )
        tg = parallelize_module(
            self.seeded(fused), self.mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()}
        )
        self.train_step(case, ref, tg, self.input(2, 3, 16), compare_params=False)
        for name_ref, name_tg in (("0", "0"), ("2", "1")):
            for p in ("weight", "bias"):
                grad_ref = getattr(ref.get_submodule(name_ref), p).grad
                self.compare(
                    case, f"{name_tg}.{p}.grad", getattr(tg.get_submodule(name_tg), p).grad, grad_ref
                )

    def attention_patch(self, case):
        """patch() on a stock attention block: projections and both attention matmuls on DTensors."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {name: ColwiseParallel(use_local_output=False) for name in ("q", "k", "v")}
        plan["o"] = RowwiseParallel()
        ref = parallelize_module(self.seeded(self.attention), self.mesh, plan)
        tg = parallelize_module(self.seeded(self.attention), self.mesh, plan)

        class Patched(torch.nn.Module):
            def __init__(self, inner, owner):
                super().__init__()
                self.inner, self.owner = inner, owner

            def forward(self, x):
                with self.owner.tg.patch() as stats:
                    y = self.inner(x)
                self.owner.note(case, "served", dict(stats.served))
                self.owner.note(case, "patch_fallbacks", stats.total_fallbacks)
                return y

        self.train_step(case, ref, Patched(tg, self), self.input(2, 5, 32), compare_params=False)
        for (name, p_ref), (_, p_tg) in zip(ref.named_parameters(), tg.named_parameters()):
            self.compare(case, f"{name}.grad", p_tg.grad, p_ref.grad)

    def attention_convert(self, case):
        """nn.convert on the attention block with the default plans (local outputs between layers)."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {
            "q": ColwiseParallel(),
            "k": ColwiseParallel(),
            "v": ColwiseParallel(),
            "o": RowwiseParallel(),
        }
        ref = parallelize_module(self.seeded(self.attention), self.mesh, plan)
        tg = parallelize_module(self.tg.nn.convert(self.seeded(self.attention)), self.mesh, plan)
        self.train_step(case, ref, tg, self.input(2, 5, 32))

    def sequence_parallel(self, case):
        """Sequence parallel: LayerNorm on sequence shards, all-gather in, reduce-scatter out."""
        from torch.distributed.tensor import Shard, distribute_tensor
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        def block():
            return torch.nn.Sequential(
                torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)
            )

        def plan():
            return {
                "0": SequenceParallel(),
                "1": ColwiseParallel(input_layouts=Shard(1)),
                "3": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            }

        ref = parallelize_module(self.seeded(block), self.mesh, plan())
        tg = parallelize_module(self.tg.nn.convert(self.seeded(block)), self.mesh, plan())
        x = distribute_tensor(self.input(2, 4, 16), self.mesh, [Shard(1)])
        x_ref = x.detach().clone().requires_grad_(True)
        x_tg = x.detach().clone().requires_grad_(True)
        y_ref, y_tg = ref(x_ref), tg(x_tg)
        self.note(case, "output_placement", _describe(y_tg.placements))
        self.compare(case, "output", y_tg, y_ref)
        y_ref.sum().backward()
        y_tg.sum().backward()
        self.compare(case, "input grad", x_tg.grad, x_ref.grad)
        for (name, p_ref), (_, p_tg) in zip(ref.named_parameters(), tg.named_parameters()):
            self.compare(case, f"{name}.grad", p_tg.grad, p_ref.grad)

    def functional(self, case):
        """tritongemm.linear / matmul / addmm on DTensors: results, placements, gradients."""
        import torch.nn.functional as F
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        def dt(t, *placements):
            return distribute_tensor(t, self.mesh, list(placements))

        x, w, bias, h = self.input(6, 16), self.input(24, 16) * 0.5, self.input(24), self.input(6, 24)
        placements = {}

        # Column-wise: activation and residual fused on each rank's columns.
        y = self.tg.linear(
            dt(x, Replicate()),
            dt(w, Shard(0)),
            dt(bias, Shard(0)),
            activation="gelu",
            residual=dt(h, Shard(1)),
        )
        placements["colwise"] = _describe(y.placements)
        self.compare(case, "colwise linear+gelu+residual", y, F.gelu(F.linear(x, w, bias)) + h)

        # Row-wise: the activation waits for the reduction; bias and residual are added once.
        x_k = dt(x.clone(), Shard(1)).requires_grad_(True)
        w_k = dt(w.clone(), Shard(1)).requires_grad_(True)
        b_r = dt(bias.clone(), Replicate()).requires_grad_(True)
        y = self.tg.linear(x_k, w_k, b_r, activation="silu", residual=dt(h, Replicate()))
        placements["rowwise_activation"] = _describe(y.placements)
        x_ref, w_ref, b_ref = (t.clone().requires_grad_(True) for t in (x, w, bias))
        y_ref = F.silu(F.linear(x_ref, w_ref, b_ref)) + h
        self.compare(case, "rowwise linear+silu+residual", y, y_ref)
        y.sum().backward()
        y_ref.sum().backward()
        for name, got, ref in (("x", x_k, x_ref), ("weight", w_k, w_ref), ("bias", b_r, b_ref)):
            self.compare(case, f"rowwise {name}.grad", got.grad, ref.grad)

        # Rows split over a replicated weight (data or sequence parallel): the weight's and the bias's
        # gradients are sums over every rank's rows.
        x_m = dt(x.clone(), Shard(0)).requires_grad_(True)
        w_r = dt(w.clone(), Replicate()).requires_grad_(True)
        b_r = dt(bias.clone(), Replicate()).requires_grad_(True)
        y = self.tg.linear(x_m, w_r, b_r, activation="gelu")
        placements["rows"] = _describe(y.placements)
        x_ref, w_ref, b_ref = (t.clone().requires_grad_(True) for t in (x, w, bias))
        y_ref = F.gelu(F.linear(x_ref, w_ref, b_ref))
        self.compare(case, "rows linear+gelu", y, y_ref)
        y.sum().backward()
        y_ref.sum().backward()
        for name, got, ref in (("x", x_m, x_ref), ("weight", w_r, w_ref), ("bias", b_r, b_ref)):
            self.compare(case, f"rows {name}.grad", got.grad, ref.grad)

        # Row-wise without an activation: the result stays a partial sum, DTensor reduces it when asked.
        y = self.tg.linear(dt(x, Shard(1)), dt(w, Shard(1)), dt(bias, Replicate()))
        placements["rowwise_linear"] = _describe(y.placements)
        self.compare(case, "rowwise linear+bias", y, F.linear(x, w, bias))
        y = self.tg.addmm(dt(h, Replicate()), dt(x, Shard(1)), dt(w.mT, Shard(0)), beta=0.5, alpha=2.0)
        self.compare(case, "rowwise addmm", y, torch.addmm(h, x, w.mT, beta=0.5, alpha=2.0))

        # A batch dimension split: no communication at all.
        a, b = self.input(4, 6, 8), self.input(4, 8, 5)
        y = self.tg.matmul(dt(a, Shard(0)), dt(b, Shard(0)))
        placements["batch"] = _describe(y.placements)
        self.compare(case, "batched matmul", y, a @ b)

        # out= with DTensors.
        out = dt(torch.empty(6, 24, device=self.device), Replicate())
        with torch.no_grad():
            self.tg.matmul(dt(x, Replicate()), dt(w.mT.contiguous(), Shard(1)), out=out)
        self.compare(case, "matmul out=", out, x @ w.mT)
        self.note(case, "placements", placements)

    def fallbacks(self, case):
        """A DTensor mixed with a plain tensor goes to torch, counted with the reason; torch raises."""
        import torch.nn.functional as F
        from torch.distributed.tensor import Replicate, distribute_tensor

        w = distribute_tensor(self.input(8, 16), self.mesh, [Replicate()])
        x = self.input(3, 16)
        errors = {}
        with self.tg.patch() as stats:
            try:
                F.linear(x, w)
            except Exception as e:  # torch's own error for mixed operands
                errors["patch"] = f"{type(e).__name__}: {e}"
        self.note(
            case, "patch_fallbacks", {f"{op}: {reason}": n for (op, reason), n in stats.fallbacks.items()}
        )
        layer = self.tg.nn.Linear(16, 8, bias=False, device=self.device)
        layer.weight = torch.nn.Parameter(w)
        try:
            layer(x)
        except Exception as e:
            errors["nn"] = f"{type(e).__name__}: {e}"
        self.note(case, "nn_fallbacks", dict(layer.fallbacks))
        try:
            F.linear(x, w)
        except Exception as e:
            errors["torch"] = f"{type(e).__name__}: {e}"
        self.note(case, "errors", errors)

    def compiled(self, case):
        """torch.compile (aot_eager) of the tensor-parallel MLP: the custom op in the graph, by the same rule."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        ref = parallelize_module(self.seeded(self.mlp), self.mesh, plan)
        tg = parallelize_module(self.tg.nn.convert(self.seeded(self.mlp)), self.mesh, plan)
        self.train_step(
            case,
            ref,
            torch.compile(tg, backend="aot_eager", fullgraph=False),
            self.input(2, 3, 16),
            compare_params=False,
        )
        for (name, p_ref), (_, p_tg) in zip(ref.named_parameters(), tg.named_parameters()):
            self.compare(case, f"{name}.grad", p_tg.grad, p_ref.grad)
        # On a GPU the aligned GEMMs of a compiled graph become aten ops (launch.COMPILED_GEMMS "auto").
        from tritongemm import launch

        self.note(case, "aten_route", self.device.type == "cuda" and launch.COMPILED_GEMMS == "auto")

    def tp_benchmark(self, case):
        """benchmarks/tp.py's measurement on tiny sizes: it runs, and both variants pass its gate."""
        from benchmarks import tp

        if self.device.type == "cuda":
            args = tp.parse_args(
                [
                    "--dtype",
                    "bf16",
                    "--hidden",
                    "256",
                    "--ffn",
                    "512",
                    "--heads",
                    "4",
                    "--kv-heads",
                    "2",
                    "--batch",
                    "2",
                    "--seq",
                    "64",
                    "--warmup",
                    "1",
                    "--rounds",
                    "1",
                    "--iters",
                    "1",
                ]
            )
        else:
            args = tp.parse_args(["--smoke"])
        rows = tp.run(args)
        self.note(case, "rows", [(r["group"], r["impl"], r["status"], r["rel_err"], r["tol"]) for r in rows])
        self.note(case, "timed", all(r["ms"] is not None and r["ms"] > 0 for r in rows))


def _describe(placements) -> list[str]:
    """Placements as version-independent words: "Shard(1)", "Replicate", "Partial(sum)"."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    words = []
    for p in placements:
        if isinstance(p, Shard):
            words.append(f"Shard({p.dim})")
        elif isinstance(p, Replicate):
            words.append("Replicate")
        elif isinstance(p, Partial):
            words.append(f"Partial({p.reduce_op})")
        else:
            words.append(repr(p))
    return words


class _Attention(torch.nn.Module):
    """Self-attention whose head count follows its (possibly sharded) projections, as Llama's does."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        # No q/k/v biases, as in Llama (and k's bias would have a zero gradient: softmax ignores it).
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x):
        bsz, seq, _ = x.shape
        q, k, v = (p(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5
        y = scores.softmax(dim=-1) @ v
        return self.o(y.transpose(1, 2).reshape(bsz, seq, -1))


CASES = [
    "mlp_convert",
    "mlp_repeated",
    "gated_mlp_convert",
    "mlp_fused_epilogue",
    "attention_patch",
    "attention_convert",
    "sequence_parallel",
    "functional",
    "fallbacks",
    "compiled",
    "tp_benchmark",
]


def _worker(rank: int, port: int, out_dir: str, backend: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=WORLD)
    try:
        cases = _Cases("cuda" if backend == "nccl" else "cpu")
        for name in CASES:
            cases.run(name, getattr(cases, name))
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(cases.results, f)
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_dir: str, backend: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    if backend == "gloo":
        env["TRITON_INTERPRET"] = "1"  # read when tritongemm's kernels are decorated, in the child
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(rank), str(port), tmp_dir, backend],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD)
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT_S)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        logs = [p.communicate()[0] for p in procs]
        pytest.fail(
            f"a worker hung past {TIMEOUT_S} s; its output:\n" + "\n".join(log[-3000:] for log in logs)
        )
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            pytest.fail(f"worker {rank} exited with {p.returncode}:\n{out[-5000:]}")
    results = []
    for rank in range(WORLD):
        with open(os.path.join(tmp_dir, f"rank{rank}.json")) as f:
            results.append(json.load(f))
    return results


@pytest.fixture(scope="module")
def cpu_results(tmp_path_factory):
    import numpy
    import triton

    from tritongemm._compat import interpreter_numpy_problem

    reason = _missing_feature() or interpreter_numpy_problem(triton.__version__, numpy.__version__)
    if reason is not None:  # (the GPU image: Triton 3.6 with numpy 2.5)
        pytest.skip(reason)
    return _launch(str(tmp_path_factory.mktemp("dtensor-gloo")), "gloo")


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory):
    reason = _missing_feature()
    if reason is not None:
        pytest.skip(reason)
    if torch.cuda.device_count() < WORLD or not torch.distributed.is_nccl_available():
        pytest.skip(f"needs {WORLD} CUDA GPUs and NCCL")
    return _launch(str(tmp_path_factory.mktemp("dtensor-nccl")), "nccl")


def _case(results: list[dict], name: str) -> list[dict]:
    """The case's result on every rank, with its comparisons checked."""
    per_rank = [r[name] for r in results]
    unsupported = [r["reference_unsupported"] for r in per_rank if r.get("reference_unsupported")]
    if unsupported:
        pytest.skip(unsupported[0][:500])
    for rank, r in enumerate(per_rank):
        assert r["error"] is None, f"rank {rank}:\n{r['error']}"
        assert r["checks"] or name in ("fallbacks", "tp_benchmark"), f"rank {rank}: nothing compared"
        for c in r["checks"]:
            assert c["shape"] == c["ref_shape"], (
                f"rank {rank}, {c['what']}: shape {c['shape']} != {c['ref_shape']}"
            )
            assert c["error"] <= c["tol"], (
                f"rank {rank}, {name}, {c['what']}: relative error {c['error']:.3g} > {c['tol']:.3g}"
            )
    return per_rank


def _check(results, name: str) -> None:
    per_rank = _case(results, name)
    r = per_rank[0]
    if name == "mlp_convert":
        # Every GEMM ran on tritongemm: 2 forward, 4 backward (dX and dW per layer), none fell back.
        assert (r["forward_launches"], r["backward_launches"], r["fallbacks"]) == (2, 4, 0), r
    elif name == "mlp_repeated":
        # Three steps of two Linears: the later steps' calls ran from entries (a signature may take the
        # whole way once more when the C++ keys take over from the Python ones).
        assert r["entry_runs"] >= 2, r
    elif name == "gated_mlp_convert":
        assert r["fused"] == "GatedMLP" and r["forward_launches"] == 3 and r["backward_launches"] == 6, r
    elif name == "mlp_fused_epilogue":
        assert (r["forward_launches"], r["backward_launches"]) == (2, 4), r
    elif name == "attention_patch":
        assert r["served"] == {"linear": 4, "matmul": 2}, r["served"]
        assert r["patch_fallbacks"] == 0
        assert r["forward_launches"] == 6 and r["backward_launches"] == 12, (
            r
        )  # 6 GEMMs, then dA and dB of each
    elif name == "attention_convert":
        assert r["forward_launches"] == 4 and r["backward_launches"] == 8, r
    elif name == "sequence_parallel":
        assert r["output_placement"] == ["Shard(1)"], r["output_placement"]
        assert r["launches"] == 2 + 4, r
    elif name == "functional":
        assert r["placements"] == {
            "colwise": ["Shard(1)"],
            "rowwise_activation": ["Replicate"],  # reduced before the activation
            "rowwise_linear": ["Partial(sum)"],  # a partial sum: DTensor reduces it when needed
            "rows": ["Shard(0)"],
            "batch": ["Shard(0)"],
        }, r["placements"]
    elif name == "fallbacks":
        for rr in per_rank:
            reason = "DTensor mixed with plain torch.Tensor operands"
            assert rr["patch_fallbacks"] == {f"linear: {reason}": 1}, rr
            assert rr["nn_fallbacks"] == {reason: 1}, rr
            # torch's own error for every door, the same type and words.
            assert set(rr["errors"]) == {"patch", "nn", "torch"}, rr["errors"]
            assert rr["errors"]["patch"] == rr["errors"]["torch"] == rr["errors"]["nn"], rr["errors"]
    elif name == "compiled":
        if not r["aten_route"]:
            assert r["forward_launches"] >= 2 and r["backward_launches"] >= 4, r
    elif name == "tp_benchmark":
        expected = {
            (g, i)
            for g in ("llama block prefill", "llama block train step")
            for i in ("torch TP", "tritongemm TP")
        }
        assert {(g, i) for g, i, *_ in r["rows"]} == expected, r["rows"]
        assert all(status == "ok" and err <= tol for _, _, status, err, tol in r["rows"]), r["rows"]
        assert r["timed"] and r["launches"] > 0, r


@pytest.mark.heavy
@pytest.mark.parametrize("name", CASES)
def test_tensor_parallel_cpu_gloo(cpu_results, name):
    _check(cpu_results, name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_tensor_parallel_two_gpus_nccl(gpu_results, name):
    _check(gpu_results, name)


@pytest.mark.skipif(_missing_feature() is not None, reason=str(_missing_feature()))
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_rule_offers_partial_sums_only_to_a_linear_epilogue(activation):
    """The reduction split yields partial sums: offered without an activation only, with partial epilogue operands."""
    from types import SimpleNamespace

    from torch.distributed.tensor import Partial, Replicate, Shard

    from tritongemm.autograd.distributed import _placements

    spec = SimpleNamespace(ndim=3)  # (batch, M, K) @ (batch, K, N): the rule reads only the rank
    rules = _placements(spec, spec, spec, spec, activation)
    partial = [(outs, ins) for outs, ins in rules if isinstance(outs[0], Partial)]
    if activation == "none":
        assert partial == [([Partial(), Replicate()], [Shard(2), Shard(1), Partial(), Partial()])]
    else:
        assert partial == []
        # The pre-activation is saved for backward: placed as the output is.
        assert all(outs[0] == outs[1] for outs, _ in rules)
    assert (
        [Shard(0), Shard(0) if activation != "none" else Replicate()],
        [Shard(0)] * 4,
    ) in rules  # batch split


@pytest.mark.heavy
def test_import_does_not_need_torch_distributed():
    """``import tritongemm`` leaves torch.distributed.tensor alone; the DTensor checks cost a look-up."""
    code = (
        "import sys, tritongemm, torch\n"
        "from tritongemm.autograd import distributed\n"
        "from tritongemm.request import fallback\n"
        "assert 'torch.distributed.tensor' not in sys.modules, 'imported by tritongemm'\n"
        "assert not distributed.is_dtensor(torch.ones(1)) and fallback.dtensor_reason(torch.ones(1)) is None\n"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), TRITON_INTERPRET="1"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
