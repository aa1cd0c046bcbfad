"""Work decomposition: sliced-K, split-K and Stream-K give the same products.

Split-K cuts K into slices reduced in a fixed order; Stream-K shares all
(tile, K-step) iterations among a persistent grid and fixes partial tiles up
in program order.  Both must be exact to the reference and bitwise
reproducible, over ragged shapes, split counts that do not divide K, and
slices shorter than one K-tile.
"""

from dataclasses import replace

import pytest
import torch
from conftest import grid_cases

import tritongemm
from tritongemm import TileConfig, explain, launch
from tritongemm.planning import schedules
from tritongemm.testing import (
    DTYPE_IDS,
    DTYPES,
    assert_close,
    assert_matches_reference,
    make_operands,
    random_tensor,
    shape_id,
)

SMALL = TileConfig(16, 32, 16, 8, 4, 2)

SHAPES = [(1, 1, 1), (5, 33, 200), (17, 40, 100), (33, 17, 45), (64, 64, 16), (70, 50, 203)]


def reference(a, b):
    return a.double() @ b.double()


REDUCE = {"separate": False, "inline": True}  # split-K's reduction: a second kernel, or the last slice


@pytest.mark.parametrize(
    "shape, split_k, reduce",
    grid_cases(
        dict(shape=SHAPES, split_k=[2, 3, 5, 64], reduce=list(REDUCE)),
        # (indices) by default every shape with both reductions, the slice counts rotating over them
        keep=lambda shape, split_k, reduce: split_k == (shape + reduce) % 4,
        ids=dict(shape=lambda s: shape_id(*s), split_k=lambda s: f"split{s}"),
    ),
)
def test_split_k_matches_reference(device, shape, split_k, reduce):
    m, n, k = shape
    a, b = make_operands(m, n, k, "NT", torch.float16, device)
    cfg = TileConfig(16, 32, 16, 8, 4, 2, split_k=split_k, split_k_inline=REDUCE[reduce])
    out = tritongemm.matmul(a, b, config=cfg)
    assert_close(out, reference(a, b))


@pytest.mark.parametrize(
    "layout, dtype, reduce",
    grid_cases(
        dict(layout=["NN", "TT", "SN"], dtype=DTYPES, reduce=list(REDUCE)),
        # (indices) by default every layout in every dtype, the reductions alternating over them
        keep=lambda layout, dtype, reduce: reduce == (layout + dtype) % 2,
        ids=dict(dtype=DTYPE_IDS.get),
    ),
)
def test_split_k_dtypes_and_layouts(device, dtype, layout, reduce):
    a, b = make_operands(19, 45, 150, layout, dtype, device)
    out = tritongemm.matmul(
        a, b, config=TileConfig(16, 16, 16, 8, 4, 2, split_k=4, split_k_inline=REDUCE[reduce])
    )
    assert_close(out, reference(a, b))


def test_inline_and_separate_reductions_agree_bitwise(device):
    # Both add the slices in slice order, so they must give the same bits.
    a, b = make_operands(40, 70, 300, "NT", torch.float32, device)
    cfg = TileConfig(16, 32, 16, 8, 4, 2, split_k=5)
    separate = tritongemm.matmul(a, b, config=cfg)
    inline = tritongemm.matmul(a, b, config=replace(cfg, split_k_inline=True))
    assert torch.equal(separate, inline)


def test_inline_reduction_rearms_its_counters(device):
    # The reducing program resets its tile's arrival counter, so the next
    # launch (here: another shape, sharing the stream's counters) starts from zero.
    from tritongemm.launch import COUNTERS as _COUNTERS

    cfg = TileConfig(16, 16, 16, 8, 4, 2, split_k=3, split_k_inline=True)
    for m, n, k in [(33, 40, 100), (33, 40, 100), (50, 17, 64), (5, 90, 200)]:
        a, b = make_operands(m, n, k, "NN", torch.float32, device)
        assert_close(tritongemm.matmul(a, b, config=cfg), reference(a, b))
        assert all(int(buf.count_nonzero()) == 0 for buf in _COUNTERS.values())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: shape_id(*s))
def test_stream_k_matches_reference(device, shape):
    m, n, k = shape
    a, b = make_operands(m, n, k, "TN", torch.float16, device)
    out = tritongemm.matmul(a, b, config=SMALL, decomposition="stream_k")
    assert_close(out, reference(a, b))


@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.float32, torch.float64],
    ids=["fp16", "bf16", "fp32", "fp64"],
)
def test_stream_k_dtypes(device, dtype):
    a, b = make_operands(40, 70, 96, "NT", dtype, device)
    out = tritongemm.matmul(a, b, config=SMALL, decomposition="stream_k")
    assert_close(out, reference(a, b))


@pytest.mark.parametrize("extra_waves", [0, 1], ids=lambda w: f"extra{w}")
@pytest.mark.parametrize("sm_count", [1, 3, 7, 132], ids=lambda s: f"sm{s}")
def test_stream_k_schedule_covers_every_iteration_once(sm_count, extra_waves, monkeypatch):
    # Data-parallel tiles plus the streamed shares cover each (tile, K-step) once;
    # only the last partial wave plus `extra_waves` full waves are streamed.
    monkeypatch.setattr(schedules, "STREAM_K_EXTRA_WAVES", extra_waves)
    for tiles, k_tiles in [(1, 1), (10, 13), (133, 64), (7, 2), (264, 3), (5, 200)]:
        programs, dp_tiles, ipp, span = schedules.stream_k_schedule(tiles, k_tiles, sm_count)
        assert programs <= sm_count and dp_tiles % programs == 0 and dp_tiles <= tiles
        covered = [0] * ((tiles - dp_tiles) * k_tiles)
        for p in range(programs):
            share = range(p * ipp, min((p + 1) * ipp, len(covered)))
            for it in share:
                covered[it] += 1
        assert covered == [1] * len(covered) and span == k_tiles
        if tiles % programs and tiles > programs:
            assert tiles - dp_tiles < (extra_waves + 1) * programs + programs


@pytest.mark.parametrize("sm_count", [1, 3, 7, 132], ids=lambda s: f"sm{s}")
def test_split_tail_schedule_cuts_the_last_wave_into_aligned_chunks(sm_count):
    # The warp-specialized kernel's Stream-K: whole waves data-parallel; each tile of the last wave cut into
    # S chunks of `ipp` K-steps (the last cut short, never empty), chunk c of every tile at the same K offset.
    for tiles, k_tiles in [(1, 1), (10, 13), (133, 64), (7, 2), (264, 3), (5, 200), (320, 224), (40, 9)]:
        programs, dp_tiles, ipp, span = schedules.split_tail_schedule(tiles, k_tiles, sm_count)
        tail = tiles - dp_tiles
        assert programs <= sm_count and dp_tiles % sm_count == 0 and tail < sm_count
        assert span % ipp == 0 and span - ipp < k_tiles <= span
        splits = span // ipp
        assert tail * splits <= programs and (splits == 1 or ipp >= schedules.SPLIT_TAIL_MIN_STEPS)
        covered = [[0] * k_tiles for _ in range(tail)]
        for p in range(programs):  # the kernel's share of program p, clipped to its tile's K-steps
            first, last = p * ipp, min((p + 1) * ipp, tail * span)
            if first < last:
                tile, offset = divmod(first, span)
                assert offset == (p % splits) * ipp and last <= (tile + 1) * span
                for k in range(offset, min(offset + last - first, k_tiles)):
                    covered[tile][k] += 1
                assert offset < k_tiles  # no share falls wholly past the tile's K-steps
        assert covered == [[1] * k_tiles for _ in range(tail)]
    # 320 tiles of 128x128 on 132 SMs (1024x5120x14336): two waves, then 56 tiles in halves.
    assert schedules.split_tail_schedule(320, 224, 132) == (132, 264, 112, 224)
    # 40 tiles (256x5120 in 128x256): three chunks each, 120 programs.
    assert schedules.split_tail_schedule(40, 224, 132) == (120, 0, 75, 225)


@pytest.mark.parametrize("extra_waves", [0, 1], ids=lambda w: f"extra{w}")
@pytest.mark.parametrize("sm_count", [2, 3, 7], ids=lambda s: f"sm{s}")
def test_stream_k_hybrid_schedule(device, sm_count, extra_waves, monkeypatch):
    # A small SM count makes these shapes span several waves: whole waves run
    # data-parallel, the rest is streamed, and split tiles are fixed up in-kernel.
    from tritongemm.launch import COUNTERS as _COUNTERS

    small_device = replace(launch.device_info(device), sm_count=sm_count)
    monkeypatch.setattr(launch, "device_info", lambda *_: small_device)
    monkeypatch.setattr(schedules, "STREAM_K_EXTRA_WAVES", extra_waves)
    launch.clear_plan_cache()
    for m, n, k in [(70, 50, 203), (33, 64, 48), (16, 32, 16)]:
        a, b = make_operands(m, n, k, "NN", torch.float32, device)
        assert_close(tritongemm.matmul(a, b, config=SMALL, decomposition="stream_k"), reference(a, b))
        assert all(
            int(buf.count_nonzero()) == 0 for buf in _COUNTERS.values()
        )  # re-armed for the next launch
    launch.clear_plan_cache()


@pytest.mark.parametrize("decomposition", ["split_k", "stream_k"])
def test_epilogue_alpha_beta_bias(device, decomposition):
    a, b = make_operands(21, 37, 130, "NN", torch.float32, device)
    bias = random_tensor((37,), torch.float32, device)
    out = tritongemm.addmm(bias, a, b, beta=0.5, alpha=-2.0, config=SMALL, decomposition=decomposition)
    assert_close(out, 0.5 * bias.double() - 2.0 * reference(a, b))


@pytest.mark.parametrize("decomposition", ["split_k", pytest.param("stream_k", marks=pytest.mark.slow)])
def test_bitwise_reproducible(device, decomposition):
    a, b = make_operands(50, 60, 333, "NN", torch.float32, device)
    first = tritongemm.matmul(a, b, config=SMALL, decomposition=decomposition)
    second = tritongemm.matmul(a, b, config=SMALL, decomposition=decomposition)
    assert torch.equal(first, second)


def test_split_k_batched_and_broadcast(device):
    a = random_tensor((3, 1, 20, 70), torch.float16, device)
    b = random_tensor((1, 2, 70, 9), torch.float16, device)
    for inline in (False, True):
        out = tritongemm.matmul(
            a, b, config=TileConfig(16, 16, 16, 8, 4, 2, split_k=3, split_k_inline=inline)
        )
        assert_close(out, reference(a, b))


def test_stream_k_batched_falls_back_to_sliced_k(device):
    a, b = (
        random_tensor((3, 20, 70), torch.float16, device),
        random_tensor((3, 70, 9), torch.float16, device),
    )
    plan = explain(a, b, decomposition="stream_k")
    assert plan.kernel == "pointer" and "Stream-K" in plan.fallback
    assert_close(tritongemm.bmm(a, b, decomposition="stream_k"), reference(a, b))


@pytest.mark.parametrize("decomposition", ["split_k", "stream_k"])
def test_backward_through_decomposition(device, decomposition):
    a = random_tensor((24, 150), torch.float32, device).requires_grad_()
    b = random_tensor((150, 20), torch.float32, device).requires_grad_()
    assert_matches_reference(
        tritongemm.matmul, torch.matmul, a, b, ours_kwargs=dict(config=SMALL, decomposition=decomposition)
    )


# K = 40 in 16-wide K-tiles over 3 slices: a ragged last slice, and M, N not tile multiples.
# The full Jacobian costs two split-K launches per input element (~640 here, about a minute
# on the interpreter), so the default run checks a random projection of it (gradcheck's fast
# mode: a wrong entry still fails) and `make test-slow` the whole Jacobian.
@pytest.mark.parametrize(
    "fast_mode", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["projected", "full"]
)
def test_gradcheck_split_k(device, fast_mode):
    a = torch.randn(9, 40, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(40, 7, dtype=torch.float64, device=device, requires_grad=True)
    cfg = TileConfig(16, 16, 16, 8, 4, 2, split_k=3)
    assert torch.autograd.gradcheck(
        lambda x, y: tritongemm.matmul(x, y, config=cfg), (a, b), fast_mode=fast_mode
    )


def test_k_zero_gives_zeros_with_every_decomposition(device):
    a, b = random_tensor((5, 0), torch.float32, device), random_tensor((0, 7), torch.float32, device)
    for decomposition in ("sliced_k", "split_k", "stream_k"):
        out = tritongemm.matmul(a, b, decomposition=decomposition)
        assert torch.equal(out, torch.zeros(5, 7, device=device)), decomposition


def test_explain_reports_the_decomposition(device):
    a, b = make_operands(64, 64, 512, "NN", torch.float16, device)
    assert explain(a, b, decomposition="split_k").config.decomposition == "split_k"
    assert explain(a, b, decomposition="stream_k").kernel == "stream_k"
    assert explain(a, b, decomposition="sliced_k").config.decomposition == "sliced_k"
    with pytest.raises(tritongemm.ConfigError, match="unknown decomposition"):
        tritongemm.matmul(a, b, decomposition="diagonal")


def test_split_k_and_tma_are_exclusive():
    with pytest.raises(tritongemm.ConfigError, match="split_k"):
        TileConfig(64, 64, 64, 8, 4, 3, kernel="tma", split_k=2)
    with pytest.raises(tritongemm.ConfigError, match="stream_k"):
        TileConfig(64, 64, 64, 8, 4, 3, split_k=2, stream_k=True)
    with pytest.raises(tritongemm.ConfigError, match="split_k_inline"):
        TileConfig(64, 64, 64, 8, 4, 3, split_k_inline=True)


def test_heuristic_splits_skinny_long_k():
    from tritongemm.device import DeviceInfo
    from tritongemm.planning.problem import GemmProblem

    h100 = DeviceInfo("H100", (9, 0), 132, 232448)
    assert tritongemm.heuristic_config(GemmProblem(8, 4096, 4096), h100).split_k > 1
    assert tritongemm.heuristic_config(GemmProblem(512, 512, 65536), h100).split_k > 1
    assert tritongemm.heuristic_config(GemmProblem(4096, 4096, 4096), h100).split_k == 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_heuristic_streams_one_wave_plus_a_sliver(dtype):
    from tritongemm.device import DeviceInfo
    from tritongemm.planning.problem import GemmProblem

    h100 = DeviceInfo("H100", (9, 0), 132, 232448)
    a100 = DeviceInfo("A100", (8, 0), 108, 166912)

    def chosen(m, n, k, device=a100):
        return tritongemm.heuristic_config(GemmProblem(m, n, k, dtype=dtype), device)

    # 120 and 110 tiles of 128 x 128 on 108 SMs: sliced-K would run a nearly empty second wave.
    assert chosen(1280, 1408, 4096).stream_k
    assert chosen(1408, 1280, 8192).stream_k
    # Where the warp-specialized kernel runs (sm_90), a 128x160 tile fills one wave instead (133 / 144
    # tiles of 128 x 128 on 132 SMs); measured at 512x5120x4096: 0.96x cuBLAS against Stream-K's 0.76.
    for m, n, k in [(896, 2432, 4096), (1536, 1536, 8192)]:
        cfg = chosen(m, n, k, h100)
        assert not cfg.stream_k and cfg.kernel == "gluon_ws" and cfg.block_n == 160, cfg
    # Full waves, too little K per program, batches, fp32: sliced-K.
    for m, n, k in [(4096, 4096, 4096), (2048, 2048, 2048), (1024, 1024, 1024), (1280, 1408, 256)]:
        assert not chosen(m, n, k).stream_k, (m, n, k)
        assert not chosen(m, n, k, h100).stream_k, (m, n, k)
    assert not tritongemm.heuristic_config(GemmProblem(1280, 1408, 4096, batch=2, dtype=dtype), a100).stream_k
    assert not tritongemm.heuristic_config(GemmProblem(1280, 1408, 4096, dtype="float32"), a100).stream_k


def test_heuristic_keeps_sliced_k_below_one_wave():
    # Llama-3-70B QKV at M = 128: 80 tiles of 128x128 on 132 SMs; measured, the
    # sliced TMA tiles beat Stream-K there (benchmarks/results/h100/decode.csv).
    from tritongemm.device import DeviceInfo
    from tritongemm.planning.problem import GemmProblem

    h100 = DeviceInfo("H100", (9, 0), 132, 232448)
    assert not tritongemm.heuristic_config(GemmProblem(128, 10240, 8192), h100).stream_k


@pytest.mark.gpu
def test_inline_reduction_counters_are_per_stream():
    # Launches on one stream never overlap, so each stream gets its own arrival
    # counters; a side stream must not share the default stream's buffer.
    from tritongemm.launch import COUNTERS as _COUNTERS

    cfg = TileConfig(16, 64, 64, 8, 4, 3, split_k=4, split_k_inline=True)
    a, b = make_operands(40, 200, 1024, "NN", torch.float16, "cuda")
    expected = reference(a, b)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out_side = tritongemm.matmul(a, b, config=cfg)
    out_main = tritongemm.matmul(a, b, config=cfg)
    torch.cuda.synchronize()
    assert_close(out_side, expected)
    assert_close(out_main, expected)
    streams = {key[1] for key in _COUNTERS if key[0].type == "cuda"}
    assert {side.cuda_stream, torch.cuda.current_stream().cuda_stream} <= streams


@pytest.mark.gpu
@pytest.mark.parametrize("decomposition", ["split_k_inline", "stream_k"])
def test_decompositions_under_cuda_graph_replay(decomposition):
    # The arrival counters of a captured launch are the graph's own, zeroed by
    # the graph at every replay; replaying twice must give the right answer twice.
    cfg = (
        TileConfig(64, 64, 64, 8, 4, 3, split_k=4, split_k_inline=True)
        if decomposition == "split_k_inline"
        else TileConfig(64, 64, 64, 8, 4, 3, stream_k=True)
    )
    a, b = make_operands(200, 300, 2048, "NT", torch.float16, "cuda")
    static_a = a.clone()
    tritongemm.matmul(static_a, b, config=cfg)  # plan and compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = tritongemm.matmul(static_a, b, config=cfg)
    for _ in range(2):
        fresh = random_tensor(a.shape, torch.float16, "cuda")
        static_a.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert_close(static_out, reference(fresh, b))


def test_heuristic_streams_a_nearly_empty_last_wave_on_the_tma_kernel():
    from tritongemm.device import DeviceInfo
    from tritongemm.planning.problem import GemmProblem

    h100 = DeviceInfo("H100", (9, 0), 132, 232448)
    a100 = DeviceInfo("A100", (8, 0), 108, 166912)
    cfg = tritongemm.heuristic_config(GemmProblem(5120, 5120, 4096), h100)  # 6.06 waves of 128x256 tiles
    assert cfg.stream_k and cfg.kernel == "tma_persistent" and (cfg.block_m, cfg.block_n) == (128, 256), cfg
    assert not tritongemm.heuristic_config(GemmProblem(5120, 5120, 4096), a100).uses_tma
    # 3072^3 (2.18 waves of 128x256) fills 2.9 waves of 128x192 tiles: the warp-specialized kernel with
    # two accumulators, measured 0.91x cuBLAS against 0.85 for 128x128 and Stream-K's 0.80.
    cfg = tritongemm.heuristic_config(GemmProblem(3072, 3072, 3072), h100)
    assert cfg.kernel == "gluon_ws" and not cfg.stream_k and (cfg.block_m, cfg.block_n) == (128, 192), cfg
    # A fuller last wave (3.88, 2.42 waves) or many waves (27.2): sliced-K.
    for m, n, k in [(4096, 4096, 4096), (1024, 10240, 8192), (4096, 28672, 4096)]:
        assert not tritongemm.heuristic_config(GemmProblem(m, n, k), h100).stream_k, (m, n, k)


@pytest.mark.parametrize("device_name", ["h100", "a100"])
def test_heuristic_runs_small_short_k_problems_unsplit_in_narrow_tiles(device_name):
    """Where split-K would fill the SMs of a small problem with a short K, more narrow tiles win
    (sweeps/small_gemm_sweep.json); a long K still splits, and so do fp32 and the long-K rule."""
    from tritongemm import KNOWN_DEVICES
    from tritongemm.planning.heuristics import (
        SMALL_MAX_K,
        SMALL_TILE,
        SMALL_WIDE_TILE,
        heuristic_choice,
        tiles_of,
    )
    from tritongemm.planning.problem import GemmProblem

    device = KNOWN_DEVICES[device_name]
    for m, n, k in [
        (512, 512, 512),
        (256, 256, 256),
        (512, 512, 1408),
        (512, 256, SMALL_MAX_K),
        (768, 384, 768),
    ]:
        for dtype in ("float16", "bfloat16"):
            problem = GemmProblem(m, n, k, dtype=dtype)
            choice = heuristic_choice(problem, device)
            cfg = choice.config
            # 64x32 tiles within one wave, 64x64 beyond it
            tile = SMALL_TILE if tiles_of(problem, 64, 32) <= device.sm_count else SMALL_WIDE_TILE
            if (m, n, k) == (768, 384, 768):
                assert tile is SMALL_WIDE_TILE  # 144 tiles of 64x32
            assert (cfg.block_m, cfg.block_n, cfg.block_k) == tile[:3], (m, n, k, cfg)
            assert cfg.split_k == 1 and cfg.kernel == "pointer" and "no split" in choice.rule
    fp32 = heuristic_choice(GemmProblem(512, 512, 512, dtype="float32"), device).config
    assert (fp32.block_n, fp32.block_k) != SMALL_TILE[1:3]
    assert heuristic_choice(GemmProblem(384, 384, SMALL_MAX_K + 128), device).config.split_k > 1
    assert heuristic_choice(GemmProblem(512, 512, 8192), device).config.split_k > 1  # long K


def test_heuristic_runs_prompt_rows_in_32_wide_tiles():
    """17-128 rows of a 2-byte problem on the H100 (sweeps/sweep_prompt*.csv, prompt_rows_check.json):
    32-wide tiles, unsplit with a short K (64 rows of 64-wide ones beyond a wave), split with a long K over
    few tiles, a K step of 256 where the narrow tiles fill the SMs, and the skinny 64x64 tile where 64-wide
    ones already fill half of them; from 65 rows only where the skinny rule would have run."""
    from tritongemm import KNOWN_DEVICES
    from tritongemm.planning.heuristics import PROMPT_ROWS, heuristic_choice
    from tritongemm.planning.problem import GemmProblem

    h100 = KNOWN_DEVICES["h100"]

    def chosen(m, n, k, dtype="bfloat16"):
        return heuristic_choice(GemmProblem(m, n, k, dtype=dtype, layout="NT"), h100)

    def tile(cfg):
        return cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k

    assert PROMPT_ROWS == (17, 128)
    for m in (17, 24, 32, 48, 64, 80, 96, 128):
        bm = 32 if m <= 32 else 64
        for dtype in ("float16", "bfloat16"):
            short = chosen(m, 1408, 512, dtype)  # 64x1408x512: 1.00 of cuBLAS against the skinny rule's 0.78
            assert tile(short.config) == (bm, 32, 128, 1), (m, short.config)
            assert "prompt-time rows" in short.rule and "no split" in short.rule
            few = chosen(m, 1024, 4096, dtype).config  # 32-64 tiles: 2-4 slices of K (1.01 against 0.85)
            assert (few.block_n, few.block_k, few.split_k_inline) == (32, 128, True) and few.split_k in (2, 4)
        # over one wave of 64x32 tiles with a short K: 64x64 (128x3072x768: 1.09 against the menu's 0.75)
        assert tile(chosen(m, 3072, 768).config) == ((64, 64, 128, 1) if m > 64 else (bm, 32, 128, 1))
        full = chosen(m, 4096, 14336)  # up to 64 rows, 128 narrow tiles: unsplit, a K step of 256
        if m <= 64:
            assert tile(full.config) == (bm, 32, 256, 1)
        else:
            assert "prompt-time rows" not in full.rule  # the skinny rule's split 64x128 tiles stay
        # 64-wide tiles fill the SMs (half of them at 64 rows, 1.5 waves at 32): the skinny tile
        # (64x14336x4096: 0.97 against 0.88; 32x28672x4096: 0.98-1.01 against 0.94-0.98)
        assert "prompt-time rows" not in chosen(m, 14336, 4096).rule, m
        if m <= 32:  # 128 tiles of 32x64: the narrow tiles still (32x8192x8192: 0.95-0.97 against 0.86-0.90)
            assert tile(chosen(m, 8192, 8192).config) == (32, 32, 256, 1)
    batched = heuristic_choice(GemmProblem(64, 1408, 512, batch=8, dtype="bfloat16"), h100)
    assert "prompt-time rows" not in batched.rule  # batches were not swept: the skinny rule as before
    for m, n, k, dtype in [
        (16, 1408, 512, "bfloat16"),
        (129, 1408, 512, "bfloat16"),
        (64, 1408, 512, "float32"),
        (128, 8448, 512, "bfloat16"),  # 66 tiles of 128x128 fill half the SMs: not skinny, the menu's rules
    ]:
        assert "prompt-time rows" not in chosen(m, n, k, dtype).rule, (m, n, k, dtype)


@pytest.mark.parametrize(
    "cfg",
    [
        TileConfig(32, 32, 128, 8, 4, 4),
        TileConfig(64, 32, 128, 8, 4, 4, split_k=4, split_k_inline=True),
        TileConfig(32, 32, 256, 8, 4, 4),
    ],
    ids=["short-k", "split", "k-step-256"],
)
@pytest.mark.parametrize("layout", ["NT", "NN"])
def test_prompt_row_configs_match_reference(device, cfg, layout):
    """The prompt-rows rule's three configs, on ragged edges (rows, columns and K not multiples of the tile)."""
    for m, n, k in [(24, 70, 300), (64, 33, 520)]:
        a, b = make_operands(m, n, k, layout, torch.bfloat16, device)
        out = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)  # poisoned
        tritongemm.matmul(a, b, config=cfg, out=out)
        assert_close(out, reference(a, b))
