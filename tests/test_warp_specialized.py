"""The warp-specialized Gluon kernel in dispatch: the heuristic's rule, the eligibility predicate, the plan,
and (on an sm_90 GPU) the public functions running it.

The kernel itself is compiled offline for sm_90 in ``test_gluon_compile.py``; Gluon does not run on the
interpreter, so on the CPU machines these tests check which kernel a plan names and why.
"""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import tritongemm
from tritongemm import GemmProblem, TileConfig, explain
from tritongemm.device import KNOWN_DEVICES, DeviceInfo
from tritongemm.kernels.gemm_gluon import CLUSTER_AVAILABLE, GLUON_AVAILABLE
from tritongemm.planning.call import NO_REQUEST, Request
from tritongemm.planning.eligibility import (
    Operand,
    warp_specialized_shared_bytes,
    warp_specialized_unsupported_reason,
)
from tritongemm.planning.heuristics import (
    NARROW_ROW_TILES,
    SHORT_ROW_GROUP_M,
    SHORT_ROW_TILES,
    SPLIT_WIDTH_TILES,
    WIDE_TILE_FEW_WAVES,
    WIDE_TILE_MANY_WAVES,
    WIDE_TILE_SINGLE_WAVE,
    WS_DEEP_TILE,
    WS_NARROW_TILE,
    heuristic_choice,
    heuristic_config,
    narrow_row_order,
    warp_specialized_tile,
    wide_tile_config,
)
from tritongemm.planning.plan import plan
from tritongemm.testing import assert_close, assert_matches_reference, make_operands, random_tensor

H100 = KNOWN_DEVICES["h100"]
A100 = KNOWN_DEVICES["a100"]
WS = TileConfig(128, 256, 64, 8, 8, 3, kernel="gluon_ws")


@pytest.mark.parametrize(
    "m,n,k,tile",
    [
        (12608, 768, 768, SPLIT_WIDTH_TILES[0]),  # encoder width: 128x192 tiles, exactly 3 waves
        (8192, 8192, 128, WS_NARROW_TILE),  # K < 512
        (8192, 8192, 256, WS_NARROW_TILE),
        (12608, 3072, 768, WS_DEEP_TILE),
        (12608, 3840, 1280, WS_DEEP_TILE),
    ],
)
def test_heuristic_takes_the_warp_specialized_kernel_for_short_k_over_many_tiles(m, n, k, tile):
    cfg = heuristic_config(GemmProblem(m, n, k, dtype="bf16"), H100)
    assert cfg.kernel == "gluon_ws" and cfg.uses_tma, cfg
    assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == (
        tile.block_m,
        tile.block_n,
        tile.warps,
        tile.stages,
    )


@pytest.mark.parametrize(
    "problem,device",
    [
        (GemmProblem(512, 768, 768, dtype="bf16"), H100),  # less than one wave of tiles
        (GemmProblem(12608, 768, 768, dtype="fp32"), H100),  # 4-byte elements
        (GemmProblem(12608, 768, 768, batch=4, dtype="bf16"), H100),  # batched
        (GemmProblem(12608, 768, 768, dtype="bf16"), A100),  # not sm_90
    ],
    ids=["one-wave", "fp32", "batched", "a100"],
)
def test_heuristic_keeps_other_shape_classes_off_it(problem, device):
    assert warp_specialized_tile(problem, device) is None
    assert heuristic_config(problem, device).kernel != "gluon_ws"


@pytest.mark.parametrize(
    "m,n,k,expected",
    [
        (1024, 3584, 3584, WIDE_TILE_SINGLE_WAVE),  # 112 tiles of 128x256: one per SM, the TMA kernel
        (2048, 2048, 2048, WIDE_TILE_SINGLE_WAVE),  # 128 tiles
        (512, 16384, 3072, WIDE_TILE_FEW_WAVES),  # 256 tiles: 1.9 waves
        (6144, 2048, 4096, WIDE_TILE_FEW_WAVES),  # 384 tiles: 2.9 waves
        (4096, 4096, 4096, WIDE_TILE_MANY_WAVES),  # 512 tiles: 3.9 waves
        (8192, 57344, 8192, WIDE_TILE_MANY_WAVES),
    ],
)
def test_the_menus_128x256_tile_takes_its_ring_and_kernel_from_its_waves(m, n, k, expected):
    problem = GemmProblem(m, n, k, dtype="bf16", layout="NT")
    choice = heuristic_choice(problem, H100)
    # (6144 x 2048: 8 tiles along N, so the tile order is groups of 4 rows: narrow_row_order)
    assert choice.config == (narrow_row_order(expected, problem) or expected) and "waves" in choice.rule
    assert (expected.kernel == "gluon_ws") == (expected is not WIDE_TILE_SINGLE_WAVE)
    # Where the warp-specialized kernel cannot go (batched, fp32, not sm_90) the rule stays out.
    assert wide_tile_config(replace(problem, batch=2), H100) is None
    assert wide_tile_config(problem, A100) is None and heuristic_config(problem, A100).kernel != "gluon_ws"
    assert not heuristic_config(replace(problem, dtype="fp32"), H100).epilogue_subtile


@pytest.mark.parametrize(
    "m,n,k,layout,tiles_along_n",
    [
        (8192, 768, 3072, "NT", 6),  # BERT-base down: 128x128 tiles
        (8192, 768, 3072, "NN", 6),
        (12608, 768, 3072, "NT", 4),  # 128x192
        (12608, 1280, 5120, "NT", 5),  # 128x256
        (8192, 1024, 4096, "NT", 4),
        (8192, 1280, 5120, "NT", 10),  # 128x128: groups of 4 rows
        (4096, 1536, 6144, "NT", 12),
        (8192, 1792, 7168, "NT", 14),
        (8192, 2304, 768, "NT", 18),  # the grouped order stays
        (4096, 14336, 4096, "NT", 56),
    ],
)
def test_a_short_row_of_tiles_runs_row_after_row(m, n, k, layout, tiles_along_n):
    choice = heuristic_choice(GemmProblem(m, n, k, dtype="bf16", layout=layout), H100)
    cfg = choice.config
    assert cfg.kernel == "gluon_ws" and -(-n // cfg.block_n) == tiles_along_n, choice
    if tiles_along_n <= NARROW_ROW_TILES:
        assert cfg.group_m == 1 and "row of tiles after another" in choice.rule, choice
    elif tiles_along_n <= SHORT_ROW_TILES:
        assert cfg.group_m == SHORT_ROW_GROUP_M == 4 and "groups of 4 rows of tiles" in choice.rule, choice
    else:
        assert cfg.group_m == 8 and "rows of tiles" not in choice.rule, choice
        assert "row of tiles" not in choice.rule, choice


def test_row_order_leaves_other_kernels_and_stream_k_alone():
    narrow = GemmProblem(8192, 768, 3072, dtype="bf16")
    assert narrow_row_order(replace(WS, group_m=8), narrow) == replace(WS, group_m=1)
    assert narrow_row_order(replace(WS, kernel="tma_persistent"), narrow) is None  # TMA kernel: not measured
    assert narrow_row_order(replace(WS, block_n=128, num_warps=4, stream_k=True), narrow) is None
    assert narrow_row_order(WS, GemmProblem(8192, 8192, 3072, dtype="bf16")) is None  # 32 tiles along N
    assert narrow_row_order(WS, GemmProblem(8192, 2048, 3072, dtype="bf16")) == replace(WS, group_m=4)
    assert narrow_row_order(replace(WS, group_m=2), narrow) is None  # a config's own tile order stays
    assert heuristic_config(narrow, A100).group_m == 8  # off sm_90 nothing changes


@pytest.mark.parametrize(
    "m,n,k,width",
    [
        (512, 5120, 4096, 160),  # 128 tiles of 128x160 on 132 SMs (128x256: 80, 128x128: 160)
        (1024, 3072, 8192, 192),  # 128 tiles of 128x192
        (1024, 4608, 3584, 96),  # 384 tiles of 128x96: 2.9 waves
        (1536, 1536, 1536, 160),
        (4096, 4096, 4096, None),  # many waves: 128x256 on the TMA kernel stays
        (8192, 4096, 4096, None),
        (1024, 1024, 1024, None),  # 64x128 on TMA fills the SMs as well
    ],
)
def test_heuristic_takes_a_split_width_tile_where_it_fills_the_sms_better(m, n, k, width):
    choice = heuristic_choice(GemmProblem(m, n, k, dtype="bf16", layout="NT"), H100)
    cfg = choice.config
    if width is None:
        assert cfg.block_n in (64, 128, 256), choice
        return
    tile = next(t for t in SPLIT_WIDTH_TILES if t.block_n == width)
    assert cfg.kernel == "gluon_ws" and (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == (
        tile.block_m,
        tile.block_n,
        tile.warps,
        tile.stages,
    ), choice
    assert "two accumulators" in choice.rule
    # Only where the Gluon kernel runs: not on an A100, not for fp32 or a batch.
    for problem, device in (
        (GemmProblem(m, n, k, dtype="bf16", layout="NT"), A100),
        (GemmProblem(m, n, k, dtype="fp32", layout="NT"), H100),
        (GemmProblem(m, n, k, batch=2, dtype="bf16", layout="NT"), H100),
    ):
        assert heuristic_config(problem, device).block_n in (64, 128, 256)


def _ops(m, n, k, b_transposed=True, elem=2):
    a = Operand.contiguous(m, k, elem)
    b = Operand(k, n, 1, k, elem) if b_transposed else Operand.contiguous(k, n, elem)
    return a, b, Operand.contiguous(m, n, elem)


def test_eligibility_names_each_reason():
    a, b, c = _ops(4096, 4096, 768)
    ok = warp_specialized_unsupported_reason(WS, a, b, c, torch.bfloat16, torch.bfloat16, H100, False)
    if GLUON_AVAILABLE:
        assert ok is None
    else:
        assert "Gluon unavailable" in ok

    def why(cfg=WS, a=a, b=b, c=c, dtype=torch.bfloat16, out=torch.bfloat16, device=H100, batched=False):
        return warp_specialized_unsupported_reason(cfg, a, b, c, dtype, out, device, batched)

    assert "sm_90" in why(device=A100)
    assert "interpreter" in why(device=DeviceInfo("interp", (9, 0), 132, 232448, interpreter=True))
    if not GLUON_AVAILABLE:
        return
    assert "fp16/bf16" in why(dtype=torch.float32, out=torch.float32)
    assert "fp16/bf16" in why(out=torch.float32)
    assert "batch" in why(batched=True)
    assert "warps" in why(cfg=TileConfig(128, 256, 64, 8, 4, 3, kernel="gluon_ws"))
    assert "shared memory" in why(cfg=TileConfig(128, 256, 64, 8, 8, 4, kernel="gluon_ws"))
    assert "16 bytes" in why(a=Operand(4096, 767, 767, 1, 2))
    assert "row-major" in why(c=Operand(4096, 4096, 1, 4096, 2))


def test_plan_names_the_kernel_or_why_not():
    problem = GemmProblem(12608, 768, 768, dtype="bf16", layout="NT")
    a, b, c = _ops(12608, 768, 768)
    chosen = plan(problem, H100, NO_REQUEST, a, b, c, torch.bfloat16, torch.bfloat16)
    assert (chosen.config.kernel == "gluon_ws") == GLUON_AVAILABLE
    if GLUON_AVAILABLE:
        assert chosen.kernel == "gluon_ws" and chosen.fallback is None
    else:
        assert chosen.kernel == "tma_persistent" and "Gluon" in chosen.fallback
    # A config the warp-specialized kernel cannot take: the same tile on the TMA kernel, and the reason.
    short_step = TileConfig(128, 128, 32, 8, 8, 4, kernel="gluon_ws")
    fallback = plan(problem, H100, Request(config=short_step), a, b, c, torch.bfloat16, torch.bfloat16)
    assert fallback.kernel == "tma_persistent" and fallback.config.kernel == "tma_persistent"
    assert ("block_k 64" if GLUON_AVAILABLE else "Gluon") in fallback.fallback


def test_explain_for_an_h100_from_any_machine():
    x = torch.empty(12608, 768, dtype=torch.bfloat16, device="meta")
    w = torch.empty(3072, 768, dtype=torch.bfloat16, device="meta")
    described = explain(x, w.mT, device="h100").describe()
    assert "warp-specialized" in described and "short K" in described
    narrow = explain(x, w[:768].mT, device="h100")  # 12608x768x768: 128x192 tiles, exactly 3 waves
    assert narrow.kernel == "gluon_ws" and "two accumulators of 128 + 64 columns" in narrow.describe()


# ----------------------------------------------------------------------------------
# On an sm_90 GPU: the public functions run it
# ----------------------------------------------------------------------------------
def _needs_hopper():
    if torch.cuda.get_device_capability() != (9, 0) or not GLUON_AVAILABLE:
        pytest.skip("the warp-specialized Gluon kernel runs on sm_90 with Gluon")


def _runs_ws(a, b, **kwargs):
    return explain(a, b, **kwargs).kernel == "gluon_ws"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,n,k", [(8192, 2304, 256), (5000, 3000, 776), (4200, 8200, 72)])
def test_matmul_every_layout_and_ragged_edges(layout, dtype, m, n, k, device):
    _needs_hopper()
    a, b = make_operands(m, n, k, layout, dtype, device)
    assert _runs_ws(a, b), explain(a, b).describe()
    assert_close(tritongemm.matmul(a, b), a.double() @ b.double(), dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "silu"])
def test_fused_epilogue_and_gradients(activation, device):
    _needs_hopper()
    x, w, bias, residual = _fused_linear_operands(8192, 2048, 512, device)
    assert _runs_ws(x, w.mT, bias=bias, residual=residual, activation=activation)
    _check_fused_linear(x, w, bias, residual, activation)


def _fused_linear_operands(m: int, n: int, k: int, device) -> tuple:
    """bf16 x (m, k), w (n, k), bias (n,) requiring grad, and a residual (m, n)."""
    dtype = torch.bfloat16
    x = random_tensor((m, k), dtype, device).requires_grad_()
    w = random_tensor((n, k), dtype, device).requires_grad_()
    bias = random_tensor((n,), dtype, device).requires_grad_()
    return x, w, bias, random_tensor((m, n), dtype, device)


def _check_fused_linear(x, w, bias, residual, activation: str, **request) -> None:
    """``linear(x, w, bias, activation=..., residual=...)`` and its gradients against torch's."""
    ours = {"activation": activation} if activation != "none" else {}
    act = tritongemm.semantics.ACTIVATIONS[activation]

    def reference(x, w, bias, residual):
        return act(F.linear(x, w, bias)) + residual

    def tg(x, w, bias, residual, **kw):
        return tritongemm.linear(x, w, bias, residual=residual, **request, **kw)

    assert_matches_reference(tg, reference, x, w, bias, residual, ours_kwargs=ours)


@pytest.mark.gpu
def test_addmm_alpha_beta_and_cuda_graph(device):
    _needs_hopper()
    dtype = torch.float16
    a, b = make_operands(8192, 4096, 384, "NT", dtype, device)
    c = random_tensor((8192, 4096), dtype, device)
    assert _runs_ws(a, b)
    out = tritongemm.addmm(c, a, b, beta=0.5, alpha=2.0)
    assert_close(out, 0.5 * c.double() + 2.0 * (a.double() @ b.double()), dtype=dtype)
    tritongemm.matmul(a, b)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tritongemm.matmul(a, b)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = tritongemm.matmul(a, b)
    a.copy_(random_tensor(a.shape, dtype, device))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(captured, a.double() @ b.double(), dtype=dtype)


PINGPONG = [
    TileConfig(128, 128, 64, 8, 4, 5, kernel="gluon_ws", pingpong=True),
    TileConfig(64, 256, 64, 8, 4, 4, kernel="gluon_ws", pingpong=True),
]
#: Tile widths that are not powers of two: two accumulators (128 + 64, 64 + 32 columns).
SPLIT_WIDTH = [
    TileConfig(128, 192, 64, 8, 8, 4, kernel="gluon_ws"),
    TileConfig(64, 192, 64, 8, 4, 5, kernel="gluon_ws", pingpong=True),
    TileConfig(128, 96, 64, 8, 4, 6, kernel="gluon_ws"),
]
#: Power-of-two tiles as two halves staged through one half-width buffer (epilogue_subtile).
SUBTILE = [
    TileConfig(128, 256, 64, 8, 8, 4, kernel="gluon_ws", epilogue_subtile=True),
    TileConfig(
        64,
        128,
        64,
        8,
        4,
        5,
        kernel="gluon_ws",
        pingpong=True,
        epilogue_subtile=True,
    ),
]


#: Clusters of two CTAs sharing one operand by TMA multicast (a Triton with Gluon CGA layouts, 3.7+):
#: B shared along M, A along N, a two-part width and a subtiled epilogue in a cluster.
CLUSTER = [
    TileConfig(128, 128, 64, 8, 8, 4, kernel="gluon_ws", cluster_m=2),
    TileConfig(128, 128, 64, 8, 4, 6, kernel="gluon_ws", cluster_n=2),
    TileConfig(128, 96, 64, 8, 4, 6, kernel="gluon_ws", cluster_m=2),
    TileConfig(
        128,
        256,
        64,
        8,
        8,
        4,
        kernel="gluon_ws",
        epilogue_subtile=True,
        cluster_n=2,
    ),
]


def _needs_clusters(cfg):
    if cfg.cluster_m * cfg.cluster_n > 1 and not CLUSTER_AVAILABLE:
        pytest.skip("clusters need a Triton whose Gluon has CGA layouts and TMA multicast (3.7+)")


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", PINGPONG + SPLIT_WIDTH + SUBTILE + CLUSTER, ids=lambda c: c.short())
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,n,k", [(3000, 2056, 776), (1000, 304, 72), (128, 128, 64)])
def test_pingpong_every_layout_ragged_edges_and_odd_tile_counts(cfg, layout, dtype, m, n, k, device):
    """Two consumers on alternate tiles, two accumulators per tile, or two CTAs per tile pair: odd and
    even tile counts per program, one tile in all (whose second part, or second CTA's, lies wholly
    outside the matrix), short K."""
    _needs_hopper()
    _needs_clusters(cfg)
    a, b = make_operands(m, n, k, layout, dtype, device)
    assert explain(a, b, config=cfg).kernel == "gluon_ws"
    assert_close(tritongemm.matmul(a, b, config=cfg), a.double() @ b.double(), dtype=dtype)


def _check_addmm(a, b, cfg) -> None:
    """``addmm(c, a, b, beta=0.5, alpha=2.0)`` under ``cfg`` against float64."""
    c = random_tensor((a.shape[0], b.shape[1]), a.dtype, a.device)
    out = tritongemm.addmm(c, a, b, beta=0.5, alpha=2.0, config=cfg)
    assert_close(out, 0.5 * c.double() + 2.0 * (a.double() @ b.double()), dtype=a.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", PINGPONG + SPLIT_WIDTH + SUBTILE + CLUSTER, ids=lambda c: c.short())
def test_pingpong_fused_epilogue_gradients_and_cuda_graph(cfg, device):
    _needs_hopper()
    _needs_clusters(cfg)
    dtype = torch.bfloat16
    _check_fused_linear(*_fused_linear_operands(4000, 1032, 512, device), "gelu", config=cfg)
    a, b = make_operands(2048, 2048, 512, "NT", dtype, device)
    _check_addmm(a, b, cfg)
    tritongemm.matmul(a, b, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = tritongemm.matmul(a, b, config=cfg)
    a.copy_(random_tensor(a.shape, dtype, device))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(captured, a.double() @ b.double(), dtype=dtype)


#: Stream-K on the warp-specialized kernel: the heuristic's tiles, and a single-stage ring.
STREAM_K = [
    TileConfig(128, 128, 64, 8, 4, 6, kernel="gluon_ws", stream_k=True),
    TileConfig(128, 256, 64, 8, 8, 3, kernel="gluon_ws", stream_k=True),
    TileConfig(64, 128, 64, 8, 4, 1, kernel="gluon_ws", stream_k=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", STREAM_K, ids=lambda c: c.short())
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "m,n,k",
    [
        (3000, 2056, 776),  # whole waves, then streamed tiles; a ragged last K-step
        (1000, 304, 4168),  # fewer tiles than SMs: every tile split, shares inside one tile
        (128, 128, 64),  # one tile, one K-step: one program
        (4100, 1000, 2000),  # ragged in M and N
    ],
)
def test_stream_k_every_layout_ragged_edges_and_schedules(cfg, layout, dtype, m, n, k, device):
    _needs_hopper()
    a, b = make_operands(m, n, k, layout, dtype, device)
    chosen = explain(a, b, config=cfg)
    assert chosen.kernel == "gluon_ws" and chosen.config.stream_k, chosen.describe()
    out = tritongemm.matmul(a, b, config=cfg)
    assert_close(out, a.double() @ b.double(), dtype=dtype)
    # The finisher adds the partials in program order: the same inputs give the same bits.
    assert torch.equal(tritongemm.matmul(a, b, config=cfg), out)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", STREAM_K[:2], ids=lambda c: c.short())
def test_stream_k_fused_epilogue_gradients_cuda_graph_and_shared_counters(cfg, device):
    _needs_hopper()
    dtype = torch.bfloat16
    _check_fused_linear(*_fused_linear_operands(1000, 1032, 3000, device), "gelu", config=cfg)
    a, b = make_operands(2048, 2048, 1536, "NT", dtype, device)
    _check_addmm(a, b, cfg)
    # Two problems in turn on one stream share the arrival counters: each launch leaves them re-armed.
    small = make_operands(700, 500, 3000, "NN", dtype, device)
    for _ in range(3):
        assert_close(
            tritongemm.matmul(*small, config=cfg), small[0].double() @ small[1].double(), dtype=dtype
        )
        assert_close(tritongemm.matmul(a, b, config=cfg), a.double() @ b.double(), dtype=dtype)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = tritongemm.matmul(a, b, config=cfg)
    for _ in range(2):  # replays re-zero the graph's own counters
        a.copy_(random_tensor(a.shape, dtype, device))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(captured, a.double() @ b.double(), dtype=dtype)


def test_stream_k_config_rules_and_plan():
    sk = STREAM_K[0]
    assert sk.decomposition == "stream_k" and sk.short() == "128x128x64 g8 w4 s6 tma+persistent+ws+streamk"
    with pytest.raises(tritongemm.ConfigError, match="one consumer"):
        replace(sk, pingpong=True)
    with pytest.raises(tritongemm.ConfigError, match="power-of-two block_n"):
        replace(sk, block_n=192, num_warps=8, num_stages=4)
    problem = GemmProblem(1024, 5120, 14336, dtype="bf16", layout="NT")
    a, b, c = _ops(1024, 5120, 14336)
    chosen = plan(problem, H100, Request(config=sk), a, b, c, torch.bfloat16, torch.bfloat16)
    if GLUON_AVAILABLE:
        assert chosen.kernel == "gluon_ws" and chosen.config == sk and chosen.fallback is None
    else:  # the TMA kernel's own Stream-K takes the tile
        assert chosen.kernel == "tma_persistent" and chosen.config.stream_k and "Gluon" in chosen.fallback


def test_pingpong_config_rules_and_budget():
    with pytest.raises(tritongemm.ConfigError, match="pingpong=True needs kernel='gluon_ws' and num_warps=4"):
        TileConfig(128, 128, 64, 8, 8, 4, kernel="gluon_ws", pingpong=True)
    with pytest.raises(
        tritongemm.ConfigError, match="pingpong=True needs kernel='gluon_ws'.*got kernel='tma_persistent'"
    ):
        TileConfig(128, 128, 64, 8, 4, 4, kernel="tma_persistent", pingpong=True)
    pp = PINGPONG[0]
    assert "pingpong" in pp.short() and "ping-pong" in pp.describe()
    # Two output staging tiles: 5 slots of 128x128x64 and 2 x 32 KiB fit an H100 block; 6 slots do not.
    assert warp_specialized_shared_bytes(pp) <= H100.smem_per_block
    assert pp.smem_bytes(2) == 5 * 32768 + 2 * 32768
    deep = replace(pp, num_stages=6)
    assert warp_specialized_shared_bytes(deep) > H100.smem_per_block
    assert warp_specialized_shared_bytes(replace(deep, pingpong=False)) <= H100.smem_per_block


def test_split_width_config_rules_budget_and_fallback():
    wide = SPLIT_WIDTH[0]
    assert (wide.block_n, wide.short()) == (192, "128x192x64 g8 w8 s4 tma+persistent+ws")
    assert warp_specialized_shared_bytes(wide) <= H100.smem_per_block
    assert warp_specialized_shared_bytes(replace(wide, num_stages=5)) > H100.smem_per_block
    assert wide.smem_bytes(2) == 4 * (128 + 192) * 64 * 2 + 128 * 192 * 2
    for bad in (176, 208, 136):  # 128 + 48, 128 + 80, 128 + 8: not two powers of two >= 16
        with pytest.raises(tritongemm.ConfigError, match="powers of two"):
            replace(wide, block_n=bad)
    with pytest.raises(tritongemm.ConfigError, match="sum of two powers of two"):
        TileConfig(128, 192, 64, 8, 8, 4, kernel="tma_persistent")  # the TMA kernel: powers of two only
    assert wide.without_warp_specialization() == TileConfig(128, 128, 64, 8, 8, 4, kernel="tma_persistent")
    # 128 x 192 on one warpgroup would hold 192 accumulators per thread.
    ops = [Operand.contiguous(4096, 4096, 2)] * 3
    reason = warp_specialized_unsupported_reason(
        replace(wide, num_warps=4), *ops, torch.bfloat16, torch.bfloat16, H100, False
    )
    if GLUON_AVAILABLE:
        assert "needs 16 warps" not in reason and "accumulator needs 8 warps" in reason
    # Where the Gluon kernel cannot run (an A100: no TMA either), the plan keeps the tile's power-of-two part.
    problem = GemmProblem(4096, 4096, 4096, dtype="bf16", layout="NT")
    shallow = replace(wide, num_stages=2)  # within an A100's shared memory
    chosen = plan(problem, A100, Request(config=shallow), *ops, torch.bfloat16, torch.bfloat16, "always")
    assert (chosen.kernel, chosen.config.block_n, chosen.config.kernel) == ("pointer", 128, "pointer")
    assert "sm_90" in chosen.fallback


def _planned_on_an_a100(cfg):
    """The plan for a contiguous bf16 4096^3 NT problem on an A100 (no TMA, no Gluon) under ``cfg``."""
    ops = [Operand.contiguous(4096, 4096, 2)] * 3
    problem = GemmProblem(4096, 4096, 4096, dtype="bf16", layout="NT")
    return plan(problem, A100, Request(config=cfg), *ops, torch.bfloat16, torch.bfloat16, "always")


def test_subtile_config_rules_budget_and_fallback():
    deep = SUBTILE[0]
    assert deep.short() == "128x256x64 g8 w8 s4 tma+persistent+ws+subtile"
    assert deep.accumulator_widths == (128, 128) and SUBTILE[1].accumulator_widths == (64, 64)
    # A half-width staging tile frees a ring slot: 128 x 256 fits four stages, not five; whole, only three.
    assert warp_specialized_shared_bytes(deep) == 4 * (128 + 256) * 64 * 2 + 128 * 128 * 2 + 16 * 4
    assert warp_specialized_shared_bytes(deep) <= H100.smem_per_block
    assert warp_specialized_shared_bytes(replace(deep, num_stages=5)) > H100.smem_per_block
    assert warp_specialized_shared_bytes(replace(deep, epilogue_subtile=False)) > H100.smem_per_block
    ops = [Operand.contiguous(4096, 4096, 2)] * 3
    reason = warp_specialized_unsupported_reason(deep, *ops, torch.bfloat16, torch.bfloat16, H100, False)
    assert reason is None or "Gluon unavailable" in reason
    for bad in (dict(block_n=192), dict(stream_k=True)):  # halves of a power of two; no Stream-K
        with pytest.raises(tritongemm.ConfigError, match="epilogue_subtile"):
            replace(deep, **bad)
    # Off sm_90 the TMA kernel takes the same tile, its epilogue in two halves as well.
    assert deep.without_warp_specialization() == TileConfig(
        128, 256, 64, 8, 8, 4, kernel="tma_persistent", epilogue_subtile=True
    )
    chosen = _planned_on_an_a100(replace(deep, num_stages=2))
    assert (chosen.kernel, chosen.config.kernel) == ("pointer", "pointer")


def test_cluster_config_rules_budget_and_fallback():
    pair = CLUSTER[0]
    assert pair.short() == "128x128x64 g8 w8 s4 tma+persistent+ws+cluster2x1"
    assert "sharing B by TMA multicast" in pair.describe() and "sharing A" in CLUSTER[1].describe()
    assert TileConfig.from_dict(pair.to_dict()) == pair
    for bad in (dict(cluster_n=2), dict(cluster_m=4), dict(cluster_m=0)):
        with pytest.raises(tritongemm.ConfigError, match="2x1 or 1x2"):
            replace(pair, **bad)
    for bad in (dict(kernel="tma_persistent"), dict(stream_k=True), dict(num_warps=4, pingpong=True)):
        with pytest.raises(tritongemm.ConfigError, match="cluster_m/cluster_n need kernel='gluon_ws'"):
            replace(pair, **bad)
    # A third mbarrier per slot: the shared box's, held by the first CTA.
    assert (
        warp_specialized_shared_bytes(pair)
        == warp_specialized_shared_bytes(replace(pair, cluster_m=1)) + 8 * 4
    )
    ops = [Operand.contiguous(4096, 4096, 2)] * 3
    reason = warp_specialized_unsupported_reason(pair, *ops, torch.bfloat16, torch.bfloat16, H100, False)
    if CLUSTER_AVAILABLE:
        assert reason is None
    elif GLUON_AVAILABLE:
        assert "clusters of CTAs unavailable" in reason and "3.7" in reason
    # Off the warp-specialized kernel the same CTA tile runs, one CTA a tile.
    assert pair.without_warp_specialization() == TileConfig(128, 128, 64, 8, 8, 4, kernel="tma_persistent")
    chosen = _planned_on_an_a100(replace(pair, num_stages=2))
    assert (chosen.kernel, chosen.config.cluster_m) == ("pointer", 1)


@pytest.mark.skipif(not CLUSTER_AVAILABLE, reason="clusters need Gluon CGA layouts (Triton 3.7+)")
def test_cluster_launch_counts_clusters_and_describes_each_ctas_part():
    from types import SimpleNamespace

    from tritongemm.launch.gluon import GluonLauncher
    from tritongemm.planning.call import GemmCall

    x = torch.randn(300, 192, dtype=torch.bfloat16)
    w = torch.randn(136, 192, dtype=torch.bfloat16)
    out = torch.empty(300, 136, dtype=torch.bfloat16)
    device = SimpleNamespace(sm_count=132)
    launcher = GluonLauncher(
        SimpleNamespace(config=CLUSTER[0], device=device), GemmCall(), x, w.T, out, out, out, out, False
    )
    fixed = dict(zip(launcher.main.args.names, launcher.main.args.template))
    # The kernel's tile is the cluster's (256 x 128): 2 x 2 of them, a program (cluster) each.
    assert (fixed["BLOCK_M"], fixed["BLOCK_N"], fixed["CLUSTER_M"], fixed["CLUSTER_N"]) == (256, 128, 2, 1)
    assert launcher.main.grid == (4, 1, 1) and launcher.main.options["num_ctas"] == 2
    assert launcher.a_desc.block_shape == [256, 64] and launcher.a_desc.layout.cga_layout == [[1, 0]]
    assert launcher.b_desc.block_shape == [128, 64] and launcher.b_desc.layout.cga_layout == [[0, 0]]
    assert launcher.c_desc.layout.cga_layout == [[1, 0]]
    # A persistent grid of clusters: half the SMs' count of programs.
    big = torch.empty(8192, 8192, dtype=torch.bfloat16)
    wide = GluonLauncher(
        SimpleNamespace(config=CLUSTER[1], device=device),
        GemmCall(),
        big[:, :192],
        big[:192],
        big,
        big,
        big,
        big,
        False,
    )
    assert (
        wide.main.grid == (66, 1, 1)
        and dict(zip(wide.main.args.names, wide.main.args.template))["BLOCK_N"] == 256
    )


def test_unaligned_c_is_padded_for_the_warp_specialized_kernel():
    """Like the TMA kernel, it stores C through a descriptor: a C with an odd leading dimension is copied."""
    m, n, k = 3001, 5003, 1009
    problem = GemmProblem(m, n, k, dtype="bf16", layout="NN")
    a, b, c = Operand.contiguous(m, k, 2), Operand.contiguous(k, n, 2), Operand.contiguous(m, n, 2)
    cfg = TileConfig(128, 256, 64, 8, 8, 3, kernel="gluon_ws")
    chosen = plan(problem, H100, Request(config=cfg), a, b, c, torch.bfloat16, torch.bfloat16, "always")
    assert chosen.kernel == ("gluon_ws" if GLUON_AVAILABLE else "tma_persistent")
    assert chosen.alignment.padded == ("A", "B", "C"), chosen.describe()
