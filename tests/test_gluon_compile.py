"""The Gluon kernel compiles for sm_90 on a machine without a GPU, under the installed Triton.

Runs Triton's whole pipeline (Gluon IR -> TTGIR -> LLVM -> PTX -> cubin through the
bundled ptxas) with a fake driver, and checks the PTX for what makes it a Hopper
warp-specialized kernel: wgmma, TMA loads and stores, setmaxnreg.  The kernel module is
loaded by path, so this file needs neither torch nor tritongemm: run it under the GPU
image's Triton from a side venv with ``python -m pytest --noconftest tests/test_gluon_compile.py``.
"""

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

KERNEL_FILE = Path(__file__).resolve().parent.parent / "tritongemm" / "kernels" / "gemm_gluon.py"
#: Shared memory one H100 block may use (sm_90's opt-in maximum).
H100_SMEM = 227 * 1024


def load_kernel_module(name="gemm_gluon_by_path"):
    """``kernels/gemm_gluon.py`` in a package of its own named ``name`` (its ``gluon_common`` too), without
    running ``kernels/__init__`` or importing tritongemm."""
    package = importlib.util.spec_from_file_location(
        name, KERNEL_FILE.parent / "__init__.py", submodule_search_locations=[str(KERNEL_FILE.parent)]
    )
    sys.modules[name] = importlib.util.module_from_spec(package)
    spec = importlib.util.spec_from_file_location(f"{name}.gemm_gluon", KERNEL_FILE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


gg = load_kernel_module()
needs_gluon = pytest.mark.skipif(
    not gg.GLUON_AVAILABLE, reason=f"no usable Gluon: {gg.GLUON_UNAVAILABLE_REASON}"
)


class _FakeDriver:
    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target


@contextlib.contextmanager
def sm90_target():
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", 90, 32)
    holder = triton.runtime.driver
    saved = holder.__dict__.get("_active")
    holder.set_active(_FakeDriver(target))
    try:
        yield target
    finally:
        holder._active = saved


def descriptor_type(dtype: str, block: list[int], cga=None) -> str:
    """The signature string the launcher's TensorDescriptor specializes to (``cga``: its box's CGA
    layout in a cluster)."""
    from triton.experimental.gluon import language as gl

    extra = {} if cga is None else {"cga_layout": cga}
    gl_dtypes = {"fp16": gl.float16, "bf16": gl.bfloat16, "fp32": gl.float32, "fp8e4nv": gl.float8e4nv}
    layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtypes[dtype], **extra)
    return f"tensordesc<{dtype}[{block[0]},{block[1]}],{layout!r}>"


def compile_kernel(
    dtype,
    bm,
    bn,
    bk,
    stages,
    a_row_major,
    b_row_major,
    num_warps,
    activation="none",
    full=False,
    consumers=1,
    bn2=0,
    stream_k=False,
    subtile=False,
    cluster_m=1,
    cluster_n=1,
    out_dtype=None,
    scaling="none",
    max_imprecise_acc=None,
    gated="",
    epilogue_warps=0,
    scale_blocks=(0, 0),
):
    """Specialize as ``launch.gluon.GluonLauncher`` does, for 16-byte-aligned sizes and pointers
    (``bn``: the tile's first, power-of-two part of N; ``bn2``: its second part, 0 for none;
    ``subtile``: ``bn2 == bn``, both halves staged through one buffer; ``out_dtype``: C's where it
    is not ``dtype``'s, as for fp8 operands with ``scaling`` and ``max_imprecise_acc``; ``scale_blocks``:
    block-scaled fp8's rows of A and columns of B per scale, with ``scaling`` "blockwise")."""
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = gg.gemm_gluon_kernel
    constexprs = dict(
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=8,
        NUM_STAGES=stages,
        A_ROW_MAJOR=a_row_major,
        B_ROW_MAJOR=b_row_major,
        HAS_ALPHA=full,
        ADDEND="full" if full else ("row" if activation != "none" else "none"),
        ACTIVATION=activation,
        HAS_RESIDUAL=full,
        STORE_PREACT=full,
        CONSUMERS=consumers,
        BLOCK_N2=bn2,
        STREAM_K=stream_k,
        EPILOGUE_SUBTILE=subtile,
        CLUSTER_M=cluster_m,
        CLUSTER_N=cluster_n,
        SCALING=scaling,
        MAX_IMPRECISE_ACC=max_imprecise_acc,
        GATED="",
        EPILOGUE_WARPS=epilogue_warps,
        SCALE_BLOCK_A=scale_blocks[0],
        SCALE_BLOCK_B=scale_blocks[1],
    )
    if scaling == "none":
        constexprs.update(sa_ptr=None, sb_ptr=None)
    if gated:  # as launch.gated.GluonGated: both biases (full) and the saved pre-activations, or neither
        constexprs.update(
            GATED=gated, ACTIVATION="none", HAS_ALPHA=False, HAS_RESIDUAL=False,
            ADDEND="row" if full else "none", STORE_PREACT=full,
        )  # fmt: skip
    out_dtype = out_dtype or dtype
    bn2 = bn2 or bn  # without a second part the launcher passes B's and C's descriptors again
    # fp8 on two consumers: each stores its half of the tile's rows (the kernel's SPLIT_ROWS).
    c_rows = bm // consumers if consumers > 1 and dtype.startswith("fp8") else bm
    ga, gb, gc = gg.cluster_layouts(cluster_m, cluster_n, a_row_major, b_row_major)
    types = dict(
        a_desc=descriptor_type(dtype, [bm, bk] if a_row_major else [bk, bm], ga),
        b_desc=descriptor_type(dtype, [bk, bn] if b_row_major else [bn, bk], gb),
        b2_desc=descriptor_type(dtype, [bk, bn2] if b_row_major else [bn2, bk], gb),
        c_desc=descriptor_type(out_dtype, [c_rows, bn], gc),
        c2_desc=descriptor_type(out_dtype, [bm, bn2], gc),
        d_ptr=f"*{out_dtype}",
        r_ptr=f"*{out_dtype}",
        z_ptr=f"*{out_dtype}",
        ws_ptr="*fp32",
        count_ptr="*i32",
        sa_ptr="*fp32",
        sb_ptr="*fp32",
        alpha="fp32",
        beta="fp32",
    )
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        signature[name] = types.get(name, "i32")
        if signature[name][0] == "*" or signature[name] == "i32":
            attrs[(i,)] = [["tt.divisibility", 16]]
    # launch.gluon.max_registers: the register file over every consumer warp + the producer's warpgroup.
    maxnreg = min(256, 65536 // ((num_warps * consumers + epilogue_warps + 4) * 32) // 8 * 8)
    with sm90_target() as target:
        return triton.compile(
            GluonASTSource(kernel, signature, constexprs, attrs),
            target=target,
            options=dict(num_warps=num_warps, maxnreg=maxnreg, num_ctas=cluster_m * cluster_n),
        )


def compiled_facts(*args) -> tuple[str, int]:
    """(PTX, shared-memory bytes) of ``compile_kernel(*args)``, compiled in a fresh process where this one
    may have run Triton's interpreter: an interpreted launch patches ``triton.language`` in its process,
    and a compile there would build on the interpreter's builder."""
    ptx, shared, _ = compiled(args)
    return ptx, shared


def disassembled(cubin_hex: str) -> str:
    """The SASS of a cubin (as ``compiled``'s hex), from the cuobjdump Triton bundles."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(bytes.fromhex(cubin_hex))
        done = subprocess.run(
            [str(cuobjdump), "-sass", str(path)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    return done.stdout


def wgmma_pipeline(sass: str) -> tuple[int, int, int]:
    """(wgmma instructions, waits for none in flight, waits leaving one in flight) in ``sass``.  ptxas
    serializes a kernel's wgmma where an instruction could touch registers a wgmma in flight writes
    (info C7514/C7515): then every wgmma is followed by a wait for none in flight."""
    return (
        len(re.findall(r"\b[HQI]GMMA\.", sass)),
        sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0"),
        sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1"),
    )


def compiled(args) -> tuple[str, int, str]:
    """(PTX, shared-memory bytes, cubin in hex) of ``compile_kernel(*args)`` (see ``compiled_facts``)."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        compiled = compile_kernel(*args)
        return compiled.asm["ptx"], compiled.metadata.shared, compiled.asm["cubin"].hex()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('gluon_compile_case', sys.argv[1])\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "compiled = mod.compile_kernel(*json.loads(sys.argv[2]))\n"
        "print(json.dumps([compiled.asm['ptx'], compiled.metadata.shared, compiled.asm['cubin'].hex()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, __file__, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        raise AssertionError(f"compiling {args} failed:\n{done.stderr[-4000:]}")
    ptx, shared, cubin = json.loads(done.stdout.splitlines()[-1])
    return ptx, shared, cubin


CASES = [
    # dtype, BM, BN, BK, stages, A row-major, B row-major, warps, activation, full epilogue, consumers,
    # second part of the tile's width (0: none)
    ("fp16", 128, 128, 64, 2, True, True, 4, "none", False, 1, 0),  # NN, double_buffer
    ("fp16", 128, 128, 64, 3, True, False, 4, "none", False, 1, 0),  # TN (x @ w.T)
    ("bf16", 128, 256, 64, 3, False, True, 8, "none", False, 1, 0),  # A transposed, 2 warpgroups cooperating
    ("bf16", 128, 128, 64, 4, False, False, 8, "gelu_tanh", True, 1, 0),  # both transposed, whole epilogue
    ("fp16", 128, 256, 64, 3, True, False, 8, "silu", False, 1, 0),  # TN with bias + activation
    ("fp16", 64, 128, 64, 1, True, True, 4, "relu", False, 1, 0),  # single_stage
    ("bf16", 128, 128, 64, 5, True, False, 4, "none", False, 2, 0),  # ping-pong, TN
    ("fp16", 64, 256, 64, 4, False, True, 4, "gelu", True, 2, 0),  # ping-pong, A transposed, whole epilogue
    ("bf16", 128, 128, 64, 4, True, False, 8, "none", False, 1, 64),  # 128 x 192: two accumulators, TN
    ("fp16", 64, 128, 64, 5, False, True, 4, "gelu", True, 2, 64),  # 64 x 192 ping-pong, whole epilogue
    ("bf16", 128, 64, 64, 6, True, True, 4, "none", False, 1, 32),  # 128 x 96, NN (B's 32 columns row-major)
]
#: Power-of-two tiles as two halves staged through one half-width buffer (epilogue_subtile): the
#: warps, stages, layouts and epilogues as above, and a fourth slot for 128 x 256 in 224 KiB.
SUBTILE_CASES = [
    ("bf16", 128, 128, 64, 4, True, False, 8, "none", False, 1, 128),  # 128 x 256 in four stages, TN
    ("fp16", 128, 128, 64, 4, False, True, 8, "gelu", True, 1, 128),  # A transposed, whole epilogue
    ("bf16", 64, 64, 64, 5, True, True, 4, "none", False, 2, 64),  # 64 x 128 ping-pong, NN
]


def case_id(c, subtile=False):
    dt, bm, bn, bk, s, ar, br, w, act, full, consumers, bn2 = c
    return (
        f"{dt}-{bm}x{bn + bn2}x{bk}-s{s}-A{'N' if ar else 'T'}B{'N' if br else 'T'}-w{w}-{(act + '-full' if act.endswith('_grad') else 'full') if full else act}"
        + ("-pingpong" if consumers == 2 else "")
        + ("-subtile" if subtile else "")
    )


@needs_gluon
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_compiles_to_a_warp_specialized_wgmma_tma_kernel(case):
    dtype, bm, bn, bk, stages, a_rm, b_rm, warps, activation, full, consumers, bn2 = case
    ptx, smem, cubin = compiled(case)
    assert "wgmma.mma_async" in ptx
    wgmmas, drained, _ = wgmma_pipeline(disassembled(cubin))
    assert drained < wgmmas, (
        f"ptxas serialized the wgmma ({drained} waits for none in flight, {wgmmas} wgmma)"
    )
    if bn2:  # the second accumulator's wgmma is bn2 wide
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bn2}k16", ptx), f"no m64n{bn2} wgmma"
        assert ".local" not in ptx, "two accumulators spill"
    bn += bn2
    # Triton 3.6 names the destination shared::cluster, 3.9 shared::cta.
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global\.mbarrier", ptx), "no TMA load"
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::\w+\.bulk_group", ptx), "no TMA store"
    assert "setmaxnreg" in ptx, "no register hand-over between partitions"
    ring = stages * (bm + bn) * bk * 2
    assert ring + consumers * bm * bn * 2 <= smem <= H100_SMEM, f"{smem} bytes of shared memory"
    if consumers == 2:  # the second consumer warpgroup is a worker partition: it raises its registers
        assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232", ptx), (
            "no register raise for consumer 2"
        )


@needs_gluon
@pytest.mark.parametrize("case", SUBTILE_CASES, ids=[case_id(c, True) for c in SUBTILE_CASES])
def test_subtiled_epilogue_stages_both_halves_through_one_buffer(case):
    dtype, bm, bn, bk, stages, a_rm, b_rm, warps, activation, full, consumers, bn2 = case
    ptx, smem = compiled_facts(
        dtype, bm, bn, bk, stages, a_rm, b_rm, warps, activation, full, consumers, bn2, False, True
    )
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bn}k16", ptx), f"no m64n{bn} wgmma"
    assert ".local" not in ptx, "two accumulators spill"
    stores = re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::\w+\.bulk_group", ptx)
    assert len(stores) >= 2, "the halves are not stored separately"
    # In program order: the first half's store, the wait for it to be read out, the second half's store.
    assert re.search(
        r"bulk_group.*?bulk\.wait_group\.read\s+0.*?global\.shared::\w+\.bulk_group", ptx, re.S
    ), "the second half does not wait for the first's store"
    # The ring and one half-width staging tile per consumer; a whole-width one would not fit 128 x 256 x 4.
    ring = stages * (bm + 2 * bn) * bk * 2
    assert ring + consumers * bm * bn * 2 <= smem <= H100_SMEM, f"{smem} bytes of shared memory"
    assert smem < ring + consumers * bm * 2 * bn * 2


STREAM_K_CASES = [
    # dtype, BM, BN, BK, stages, A row-major, B row-major, warps, activation, full epilogue
    ("bf16", 128, 128, 64, 6, True, False, 4, "none", False),  # the heuristic's tile, TN
    ("fp16", 128, 256, 64, 3, False, True, 8, "gelu", True),  # two warpgroups cooperating, whole epilogue
    ("fp16", 64, 128, 64, 1, True, True, 4, "none", False),  # single_stage
]


@needs_gluon
@pytest.mark.parametrize("case", STREAM_K_CASES, ids=[case_id((*c, 1, 0)) for c in STREAM_K_CASES])
def test_stream_k_compiles_with_its_fix_up(case):
    dtype, bm, bn, bk, stages, a_rm, b_rm, warps, activation, full = case
    ptx, smem = compiled_facts(dtype, bm, bn, bk, stages, a_rm, b_rm, warps, activation, full, 1, 0, True)
    assert "wgmma.mma_async" in ptx and "setmaxnreg" in ptx
    # The contributor's release and the finisher's acquire on the tile's counter, at GPU scope (an
    # atomic whose result is unused lowers to red, an atomic add of 0 to an acquire load).
    assert re.search(r"(atom|red)\.global\.gpu\.release\.add", ptx), "no release atomic"
    assert re.search(r"(atom\.global\.gpu\.acquire\.add|ld\.global\.gpu\.acquire)", ptx), "no acquire"
    assert "ld.global.cg" in ptx, "the finisher does not read the partials past L1"
    # The barrier before the release is the consumer partition's own: its warps only, not the producer's.
    assert re.search(rf"bar\.sync\s+\d+,\s*{warps * 32};", ptx), "no barrier over the consumer's warps"
    ring = stages * (bm + bn) * bk * 2
    assert ring + bm * bn * 2 <= smem <= H100_SMEM


needs_clusters = pytest.mark.skipif(
    not gg.CLUSTER_AVAILABLE, reason=f"no Gluon clusters: {gg.CLUSTER_UNAVAILABLE_REASON}"
)
CLUSTER_CASES = [
    # dtype, CTA tile BM x BN, stages, A row-major, B row-major, warps, activation, full epilogue, cluster
    ("fp16", 128, 256, 3, True, False, 8, "none", False, (2, 1)),  # TN, B shared along M
    ("bf16", 128, 256, 3, False, True, 8, "gelu", True, (2, 1)),  # A transposed, whole epilogue
    ("bf16", 128, 128, 4, True, True, 4, "none", False, (1, 2)),  # NN, A shared along N
    ("fp16", 128, 128, 5, False, False, 8, "silu", False, (1, 2)),  # both transposed
]


@needs_clusters
@pytest.mark.parametrize(
    "case",
    CLUSTER_CASES,
    ids=[f"{c[0]}-{c[1]}x{c[2]}-cluster{c[9][0]}x{c[9][1]}-{c[7]}" for c in CLUSTER_CASES],
)
def test_a_cluster_of_two_shares_one_operand_by_multicast(case):
    dtype, bm, bn, stages, a_rm, b_rm, warps, activation, full, (cm, cn) = case
    ptx, smem = compiled_facts(
        dtype, bm * cm, bn * cn, 64, stages, a_rm, b_rm, warps, activation, full, 1, 0, False, False, cm, cn
    )
    assert re.search(r"\.reqnctapercluster 2", ptx), "not launched as a cluster of two"
    # The shared operand's box is multicast (from the first CTA; a box wider than the 128-byte swizzle
    # goes as several copies), the CTA's own half is a plain copy as before.
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\S*multicast::cluster", ptx)
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\.mbarrier", ptx)
    # Each consumer releases the shared slot in the first CTA: a cluster-scope arrive.
    assert "mbarrier.arrive.shared::cluster" in ptx
    assert "%cluster_ctarank" in ptx and "wgmma.mma_async" in ptx and ".local" not in ptx
    # Shared memory is the CTA's: its ring of bm x 64 + 64 x bn boxes and its output tile.
    ring = stages * (bm + bn) * 64 * 2
    assert ring + bm * bn * 2 <= smem <= H100_SMEM, f"{smem} bytes of shared memory"


def test_cluster_layouts_split_the_clustered_dimension_and_share_the_other():
    # (A's, B's, C's) layouts as each descriptor stores its box: A^T / B^T when not row-major.
    assert gg.cluster_layouts(1, 1, True, True) == (None, None, None)
    assert gg.cluster_layouts(2, 1, True, False) == ([[1, 0]], [[0, 0]], [[1, 0]])
    assert gg.cluster_layouts(2, 1, False, True) == ([[0, 1]], [[0, 0]], [[1, 0]])
    assert gg.cluster_layouts(1, 2, True, True) == ([[0, 0]], [[0, 1]], [[0, 1]])
    assert gg.cluster_layouts(1, 2, True, False) == ([[0, 0]], [[1, 0]], [[0, 1]])
    with pytest.raises(ValueError, match="two CTAs"):
        gg.cluster_layouts(2, 2, True, True)


@needs_gluon
def test_tile_span_stays_a_runtime_value():
    # Specialized to the constant 1 (a one-K-step problem), Triton 3.6 cannot lower the kernel.
    kernel = gg.gemm_gluon_kernel
    assert kernel.params[kernel.arg_names.index("tile_span")].do_not_specialize


@needs_gluon
def test_the_largest_ring_that_does_not_fit_is_reported_over_budget():
    # 4 slots of a 128x256x64 tile plus the output tile need 256 KiB: the launcher's
    # shared-memory predicate must rule this config out, and the compiler agrees.
    _, shared = compiled_facts("fp16", 128, 256, 64, 4, True, True, 8)
    assert shared > H100_SMEM


def test_module_imports_without_gluon(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon", None)
    mod = load_kernel_module("gemm_gluon_without_gluon")
    assert mod.GLUON_AVAILABLE is False
    assert "not importable" in mod.GLUON_UNAVAILABLE_REASON


@needs_gluon
def test_launcher_binds_every_kernel_argument_and_describes_each_operand_as_stored():
    torch = pytest.importorskip("torch", reason="the launcher part needs torch")
    from dataclasses import replace
    from types import SimpleNamespace

    from tritongemm.launch.gluon import GluonLauncher, max_registers
    from tritongemm.planning.call import GemmCall
    from tritongemm.planning.configs import TileConfig

    x = torch.randn(300, 192, dtype=torch.bfloat16)
    w = torch.randn(136, 192, dtype=torch.bfloat16)  # x @ w.T: B is a transposed view
    out = torch.empty(300, 136, dtype=torch.bfloat16)
    cfg = TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)
    plan = SimpleNamespace(config=cfg, device=SimpleNamespace(sm_count=4))
    launcher = GluonLauncher(plan, GemmCall(), x, w.T, out, out, out, out, False)
    fixed = dict(zip(launcher.main.args.names, launcher.main.args.template))
    assert (fixed["M"], fixed["N"], fixed["K"]) == (300, 136, 192)
    assert fixed["A_ROW_MAJOR"] is True and fixed["B_ROW_MAJOR"] is False
    assert launcher.b_desc.shape == [136, 192] and launcher.b_desc.block_shape == [128, 64]
    assert launcher.main.grid == (4, 1, 1)  # 3 x 2 tiles on 4 SMs: persistent
    assert launcher.main.options["maxnreg"] == max_registers(8) == 168
    assert launcher.a_desc.base is None  # the cached launcher keeps no operand alive
    assert (fixed["STREAM_K"], fixed["dp_tiles"], fixed["iters_per_program"], fixed["tile_span"]) == (
        False,
        6,
        0,
        0,
    )
    # Stream-K: 6 tiles x 56 K-steps on 4 SMs: one whole wave, then the last 2 tiles in halves of 28 K-steps
    # (schedules.split_tail_schedule); the launch passes the workspace (a slot per program) and the counters.
    x_long, w_long = (
        torch.randn(300, 3584, dtype=torch.bfloat16),
        torch.randn(136, 3584, dtype=torch.bfloat16),
    )
    sk = GluonLauncher(
        SimpleNamespace(config=replace(cfg, stream_k=True), device=plan.device),
        GemmCall(), x_long, w_long.T, out, out, out, out, False,
    )  # fmt: skip
    fixed = dict(zip(sk.main.args.names, sk.main.args.template))
    assert (fixed["STREAM_K"], fixed["dp_tiles"], fixed["iters_per_program"], fixed["tile_span"]) == (
        True,
        4,
        28,
        56,
    )
    assert sk.main.grid == (4, 1, 1)
    ws, counts = sk.buffers.get(x.device)
    assert ws.shape == (4, 128, 128) and ws.dtype == torch.float32 and counts.dtype == torch.int32
    assert counts.numel() >= 2 and not counts[:2].any()
    with pytest.raises(ValueError, match="unit last stride"):
        column_major = torch.empty(136, 304, dtype=torch.bfloat16).T[:300]
        GluonLauncher(plan, GemmCall(), x, w.T, column_major, out, out, out, False)


#: fp8 operands (K-major both, as wgmma reads fp8), bf16 or fp32 out: dtype-wide K-steps of 128 bytes.
#: (BM, BN, BN2, stages, warps, consumers, C's dtype, scaling, max_imprecise_acc, activation)
FP8_CASES = [
    (128, 128, 128, 4, 8, 1, "bf16", "rowwise", 128, "none"),  # 128 x 256 subtiled, precise sums
    (128, 128, 0, 6, 8, 1, "bf16", "tensorwise", None, "gelu"),  # fast accumulation, bias + GELU
    (128, 128, 0, 6, 8, 1, "bf16", "tensorwise", 128, "none"),  # precise, one 8-warp consumer
    (64, 128, 0, 6, 4, 1, "fp32", "rowwise", 128, "none"),  # fp32 out
    (128, 128, 0, 6, 4, 2, "bf16", "rowwise", 128, "none"),  # two consumers on the rows' halves, precise
    (128, 128, 0, 5, 4, 2, "bf16", "rowwise", None, "none"),  # the same, fast accumulation
    (128, 256, 0, 3, 4, 2, "bf16", "tensorwise", None, "none"),  # 64 x 256 halves, fast accumulation
]


@needs_gluon
@pytest.mark.parametrize(
    "case",
    FP8_CASES,
    ids=[f"{c[0]}x{c[1] + c[2]}-s{c[3]}-w{c[4]}-c{c[5]}-{c[6]}-{c[7]}-acc{c[8]}" for c in FP8_CASES],
)
def test_fp8_compiles_to_e4m3_wgmma_with_scales_in_the_epilogue(case):
    bm, bn, bn2, stages, warps, consumers, out, scaling, imprecise, activation = case
    subtile = bn2 == bn
    ptx, smem, cubin = compiled((
        "fp8e4nv", bm, bn, 128, stages, True, False, warps, activation, False, consumers, bn2, False,
        subtile, 1, 1, out, scaling, imprecise,
    ))  # fmt: skip
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bn}k32\.f32\.e4m3\.e4m3", ptx), "no fp8 wgmma"
    assert ".local" not in ptx, "the accumulators spill"
    wgmmas, drained, one_in_flight = wgmma_pipeline(disassembled(cubin))
    assert drained < wgmmas, (
        f"ptxas serialized the wgmma ({drained} waits for none in flight, {wgmmas} wgmma)"
    )
    # Precise sums on 64-float accumulators add each K-step's partial under the next step's wgmma.
    deferred = (
        imprecise is not None and bn2 == 0 and (bm // consumers) * bn // (32 * warps // consumers) <= 64
    )
    assert one_in_flight > 0 or not deferred, "precise partial sums are added with no wgmma in flight"
    # The scales are read in the epilogue: one per tile (tensorwise) or a vector per row / column.
    assert ptx.count("ld.global") >= 2
    if consumers == 2:  # fp8's two consumers split each tile's rows: each releases slots and stores its half
        assert not re.search(r"bar\.sync\s+\d+, 256", ptx), "the two consumers synchronize with each other"
        stores = re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::\w+\.bulk_group", ptx)
        assert len(stores) >= 2, "the halves are not stored by both consumers"
    out_size = 4 if out == "fp32" else 2
    ring = stages * (bm + bn + bn2) * 128
    staged = bm * (bn + bn2) * out_size // (2 if subtile else 1)  # (two consumers: a half tile each)
    assert ring + staged <= smem <= H100_SMEM, f"{smem} bytes of shared memory"


#: Block-scaled fp8 (a scale per 128 of K, dequantized each K-step in the mainloop), K-major operands,
#: K-steps of 128: (BM, BN, stages, warps, consumers, Stream-K, scale_blocks, C's dtype), scale_blocks
#: the rows of A and columns of B per scale (1 x 128 / 128 x 128 blocks).  Two consumers split each
#: tile's rows (the kernel's SPLIT_ROWS), each staging its half.  The first case is the heuristic's
#: tile (``heuristics.fp8.FP8_BLOCK_SCALED_TILE``); the rest run in the slow tier.
SCALE_BLOCK_IDS = {(1, 128): "1x128-128x128", (1, 1): "1x128-1x128", (128, 1): "128x128-1x128"}
BLOCK_SCALED_CASES = [
    pytest.param(128, 128, 6, 4, 2, False, (1, 128), "bf16", id="128x128-s6-w4-c2-1x128-128x128-bf16"),
    *(
        pytest.param(
            *c,
            id=f"{c[0]}x{c[1]}-s{c[2]}-w{c[3]}-c{c[4]}{'-streamk' if c[5] else ''}-{SCALE_BLOCK_IDS[c[6]]}-{c[7]}",
            marks=pytest.mark.slow,
        )
        for c in [
            (128, 128, 6, 4, 2, False, (1, 1), "bf16"),  # 1x128 x 1x128
            (128, 128, 6, 4, 2, False, (128, 1), "bf16"),  # 128x128 x 1x128
            (128, 128, 3, 4, 2, False, (1, 128), "fp32"),  # as planned for an fp32 output
            (128, 128, 6, 8, 1, False, (1, 128), "bf16"),  # one consumer of 8 warps (a caller's tile)
            (128, 128, 6, 8, 1, False, (1, 1), "bf16"),
            (128, 128, 6, 8, 1, False, (128, 1), "bf16"),
            (64, 128, 6, 4, 1, False, (1, 128), "bf16"),  # heuristics.fp8.FP8_NARROW_TILE, forced
            (128, 128, 5, 8, 1, True, (1, 128), "fp32"),  # Stream-K, fp32 out
        ]
    ),
]


@needs_gluon
@pytest.mark.parametrize("bm, bn, stages, warps, consumers, stream_k, scale_blocks, out", BLOCK_SCALED_CASES)
def test_block_scaled_fp8_compiles_without_spills(
    bm, bn, stages, warps, consumers, stream_k, scale_blocks, out
):
    ptx, smem = compiled_facts(
        "fp8e4nv", bm, bn, 128, stages, True, False, warps, "none", False, consumers, 0, stream_k, False,
        1, 1, out, "blockwise", 128, "", 0, list(scale_blocks),
    )  # fmt: skip
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bn}k32\.f32\.e4m3\.e4m3", ptx), "no fp8 wgmma"
    assert ".local" not in ptx, "the accumulators spill"
    assert "ld.global" in ptx, "no scale is read"
    if consumers == 2:  # both consumer warpgroups raise their registers, and each stores its half
        assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232", ptx), "no register raise"
        stores = re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::\w+\.bulk_group", ptx)
        assert len(stores) >= 2, "the halves are not stored by both consumers"
    # The ring and the output tile (two half tiles with two consumers), within an H100's shared memory.
    ring = stages * (bm + bn) * 128
    staged = bm * bn * (4 if out == "fp32" else 2)
    assert ring + staged <= smem <= H100_SMEM, f"{smem} bytes of shared memory"


#: The gated (GLU MLP) mode of launch.gated.GluonGated: 128 x 128 tiles of h from two 128-wide weight
#: tiles, cooperative, four slots (h staged alone) or three (g staged too, with both biases).
GATED_CASES = [("bf16", 4, False, "silu"), ("fp16", 3, True, "gelu_tanh")]


@needs_gluon
@pytest.mark.parametrize(
    "case", GATED_CASES, ids=[f"{c[0]}-s{c[1]}-{'saved' if c[2] else 'h'}-{c[3]}" for c in GATED_CASES]
)
def test_gated_mode_keeps_two_accumulators_and_stores_one_tile(case):
    dtype, stages, saved, activation = case
    ptx, smem = compiled_facts(
        dtype, 128, 128, 64, stages, True, False, 8, "none", saved, 1, 128, False, False, 1, 1, None,
        "none", None, activation,
    )  # fmt: skip
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16", ptx)) >= 2, "not two accumulators"
    assert ".local" not in ptx, "the accumulators spill"
    stores = len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::\w+\.bulk_group", ptx))
    assert stores == (2 if saved else 1), f"{stores} TMA stores"
    ring = stages * (128 + 256) * 64 * 2
    assert ring + (2 if saved else 1) * 128 * 128 * 2 <= smem <= H100_SMEM, f"{smem} bytes of shared memory"


#: Epilogue warps (launch.gluon.GluonLauncher's rule: one 4-warp consumer, an activation or a residual):
#: the consumer stages z, four more warps finish and store each tile under the next tile's mainloop.
EPILOGUE_WARP_CASES = [
    ("bf16", 6, "gelu", False, False),
    ("fp16", 6, "silu", True, False),
    ("bf16", 6, "gelu_tanh_grad", True, False),  # a derivative epilogue: dL/dh * act'(z), z read as R
    ("bf16", 6, "gelu", False, True),
]


@needs_gluon
@pytest.mark.parametrize(
    "case",
    EPILOGUE_WARP_CASES,
    ids=[
        f"{c[0]}-s{c[1]}-{(c[2] + '-full' if c[2].endswith('_grad') else 'full') if c[3] else c[2]}{'-streamk' if c[4] else ''}"
        for c in EPILOGUE_WARP_CASES
    ],
)
def test_epilogue_warps_finish_tiles_off_the_consumer(case):
    dtype, stages, activation, full, stream_k = case
    warps = 8 if activation.endswith("_grad") else 4  # (``launch.gluon.epilogue_warps``)
    ptx, smem = compiled_facts(
        dtype, 128, 128, 64, stages, True, False, 4, activation, full, 1, 0, stream_k, False, 1, 1, None,
        "none", None, "", warps,
    )  # fmt: skip
    assert ".local" not in ptx, "spills"
    # One TMA store, issued by the epilogue warps (and one more with Stream-K: the consumer's streamed tiles).
    stores = len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::\w+\.bulk_group", ptx))
    assert stores == 1 + stream_k, f"{stores} TMA stores"
    regs = {4: 152, 8: 72}[warps]  # eight warps share four's registers
    assert re.search(rf"setmaxnreg\.\w+\.sync\.aligned\.u32\s+{regs}\b", ptx), (
        "no register budget for the epilogue warps"
    )
    ring = stages * (128 + 128) * 64 * 2
    assert ring + 128 * 128 * 2 <= smem <= H100_SMEM, f"{smem} bytes of shared memory"
