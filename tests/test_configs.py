"""TileConfig as a value: the rules it enforces, the budgets it is validated
against (with messages naming the budget and the excess), describe(), the
pipeline names, and the candidate space.  No kernels run here.
"""

import dataclasses
import json
import re

import pytest

import tritongemm
from tritongemm import PIPELINES, ConfigError, GemmProblem, TileConfig, candidate_configs, launch
from tritongemm.device import INTERPRETER_DEVICE, DeviceInfo
from tritongemm.planning.configs import (
    ACCUMULATOR_REGISTER_BUDGET,
    KERNELS,
    MAX_STAGES,
    SPLIT_K_KERNELS,
    STREAM_K_KERNELS,
    TMA_KERNELS,
    resolve_pipeline,
)

#: A device with a small shared memory, to see the budget arithmetic at work.
SMALL_GPU = DeviceInfo(name="small-gpu", capability=(8, 0), sm_count=8, smem_per_block=48 * 1024)


# ----------------------------------------------------------------------------------
# Rules checked when a TileConfig is built
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value, words",
    [
        ("block_m", 48, "power"),
        ("block_n", 100, "power"),
        ("block_k", 24, "power"),
        ("block_k", 8, ">= 16"),  # a power of two, but below tl.dot's minimum
        ("block_m", 0, "power"),
        ("group_m", 0, ">= 1"),
        ("num_warps", 3, "one of"),
        ("num_stages", 0, "num_stages"),
        ("num_stages", MAX_STAGES + 1, "num_stages"),
        ("block_m", 64.0, "must be an int"),
        ("num_warps", True, "must be an int"),
    ],
    ids=lambda v: str(v),
)
def test_rejects_bad_fields(field, value, words):
    with pytest.raises(ConfigError) as info:
        TileConfig(**{field: value})
    message = str(info.value)
    assert field in message and str(value) in message and words in message, message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "stages, name",
    [(1, "single_stage"), (2, "double_buffer"), (3, "multi_stage"), (MAX_STAGES, "multi_stage")],
)
def test_pipeline_names(stages, name):
    assert TileConfig(num_stages=stages).pipeline == name


def test_pipelines_table_and_resolution():
    assert PIPELINES == {"single_stage": 1, "double_buffer": 2, "multi_stage": 3}
    assert resolve_pipeline("single_stage") == 1
    assert resolve_pipeline("double_buffer") == 2
    assert resolve_pipeline("multi_stage", default_multi=5) == 5
    assert resolve_pipeline(4) == 4
    for bad, words in [
        ("triple", "unknown pipeline"),
        (0, "stage count"),
        (MAX_STAGES + 1, "stage count"),
        (True, "name or a stage count"),
    ]:
        with pytest.raises(ConfigError, match=words):
            resolve_pipeline(bad)


def test_with_pipeline_keeps_tiles():
    cfg = TileConfig(64, 32, 16, 4, 2, 5)
    assert cfg.with_pipeline("single_stage") == dataclasses.replace(cfg, num_stages=1)
    assert cfg.with_pipeline("multi_stage").num_stages == 5  # already multi-stage: kept
    assert TileConfig(num_stages=1).with_pipeline("multi_stage").num_stages == 3
    assert cfg.with_pipeline(2).num_stages == 2


# ----------------------------------------------------------------------------------
# The kernel a config names, its options, and the booleans that named it before
# ----------------------------------------------------------------------------------
#: The fields of a dict written before ``TileConfig.kernel``, every kernel boolean off.
OLD_DICT = dict(
    block_m=64,
    block_n=64,
    block_k=32,
    group_m=8,
    num_warps=4,
    num_stages=3,
    tma=False,
    persistent=False,
    warp_specialize=False,
    epilogue_subtile=False,
    pingpong=False,
    cluster_m=1,
    cluster_n=1,
    split_k=1,
    split_k_inline=False,
    stream_k=False,
    gemv=False,
)


@pytest.mark.parametrize(
    "flags, kernel, launcher, short",
    [
        ({}, "pointer", "pointer", "64x64x32 g8 w4 s3"),
        ({"stream_k": True}, "pointer", "stream_k", "64x64x32 g8 w4 s3 streamk"),
        ({"split_k": 4, "split_k_inline": True}, "pointer", "pointer", "64x64x32 g8 w4 s3 splitk4i"),
        ({"tma": True}, "tma", "tma", "64x64x32 g8 w4 s3 tma"),
        ({"tma": True, "epilogue_subtile": True}, "tma", "tma", "64x64x32 g8 w4 s3 tma+subtile"),
        (
            {"tma": True, "persistent": True},
            "tma_persistent",
            "tma_persistent",
            "64x64x32 g8 w4 s3 tma+persistent",
        ),
        (
            {"tma": True, "persistent": True, "stream_k": True},
            "tma_persistent",
            "tma_persistent",
            "64x64x32 g8 w4 s3 tma+persistent+streamk",
        ),
        (
            {"tma": True, "persistent": True, "warp_specialize": True, "pingpong": True},
            "gluon_ws",
            "gluon_ws",
            "64x64x32 g8 w4 s3 tma+persistent+ws+pingpong",
        ),
        (
            {"tma": True, "persistent": True, "warp_specialize": True, "stream_k": True},
            "gluon_ws",
            "gluon_ws",
            "64x64x32 g8 w4 s3 tma+persistent+ws+streamk",
        ),
        (
            {"tma": True, "persistent": True, "warp_specialize": True, "cluster_m": 2},
            "gluon_ws",
            "gluon_ws",
            "64x64x32 g8 w4 s3 tma+persistent+ws+cluster2x1",
        ),
        # the Gluon kernel had no other grid: warp_specialize without persistent ran it the same
        (
            {"tma": True, "warp_specialize": True},
            "gluon_ws",
            "gluon_ws",
            "64x64x32 g8 w4 s3 tma+persistent+ws",
        ),
        (
            {
                "gemv": True,
                "block_m": 16,
                "block_n": 8,
                "num_stages": 1,
                "split_k": 2,
                "split_k_inline": True,
            },
            "gemv",
            "gemv",
            "16x8x32 g8 w4 s1 splitk2i+gemv",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_old_kernel_booleans_read_as_one_kernel(flags, kernel, launcher, short):
    """A dict written with the booleans that chose the kernel reads as that kernel: the same launcher,
    the same ``short()`` (result CSVs hold it), and it writes the kernel back."""
    cfg = TileConfig.from_dict({**OLD_DICT, **flags})
    assert (cfg.kernel, cfg.launcher, cfg.short()) == (kernel, launcher, short)
    assert cfg.uses_tma == flags.get("tma", False)
    written = cfg.to_dict()
    assert written["kernel"] == kernel and not set(written) & {"tma", "persistent", "warp_specialize", "gemv"}
    assert TileConfig.from_dict(written) == cfg
    assert TileConfig.from_dict(json.loads(json.dumps(written))) == cfg


@pytest.mark.parametrize(
    "flags, words",
    [
        ({"persistent": True}, "persistent=True needs tma=True"),
        ({"warp_specialize": True}, "warp_specialize=True needs tma=True"),
        ({"tma": True, "gemv": True}, "gemv is its own kernel"),
        ({"tma": "yes"}, "tma must be a bool, got 'yes'"),
        ({"gemv": 1}, "gemv must be a bool, got 1"),
        (
            {"tma": True, "kernel": "tma"},
            "old kernel fields ['gemv', 'persistent', 'tma', 'warp_specialize'] and kernel='tma'",
        ),
        ({"tma": True, "split_k": 2}, "split_k=2 runs on kernel 'pointer', 'gemv', not kernel='tma'"),
        ({"tma": True, "stream_k": True}, "set kernel='tma_persistent'"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_old_kernel_booleans_keep_their_rules(flags, words):
    with pytest.raises(ConfigError) as info:
        TileConfig.from_dict({**OLD_DICT, **flags})
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("kernel", ["cutlass", "TMA", "", True, None])
def test_rejects_a_kernel_that_does_not_exist(kernel):
    with pytest.raises(ConfigError) as info:
        TileConfig(kernel=kernel)
    message = str(info.value)
    assert f"kernel={kernel!r}" in message and all(repr(k) in message for k in KERNELS), message


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(epilogue_subtile=True), ["epilogue_subtile=True needs a TMA kernel", "got kernel='pointer'"]),
        (dict(kernel="gemv", num_stages=1, epilogue_subtile=True), ["needs a TMA kernel", "kernel='gemv'"]),
        (dict(kernel="tma", pingpong=True), ["pingpong=True needs kernel='gluon_ws'", "got kernel='tma'"]),
        (dict(kernel="gluon_ws", num_warps=8, pingpong=True), ["num_warps=4", "num_warps=8"]),
        (
            dict(kernel="tma_persistent", cluster_n=2),
            ["cluster_m/cluster_n need kernel='gluon_ws'", "got kernel='tma_persistent'"],
        ),
        (dict(kernel="gluon_ws", cluster_m=2, stream_k=True), ["no Stream-K", "stream_k=True"]),
        (
            dict(kernel="tma_persistent", split_k=4),
            ["split_k=4 runs on kernel 'pointer', 'gemv'", "'tma_persistent'"],
        ),
        (dict(kernel="gluon_ws", split_k=2), ["split_k=2", "not kernel='gluon_ws'"]),
        (dict(kernel="tma", stream_k=True), ["'pointer', 'tma_persistent', 'gluon_ws', not kernel='tma'"]),
        (dict(kernel="gemv", num_stages=1, stream_k=True), ["stream_k=True", "not kernel='gemv'"]),
        (dict(kernel="gluon_ws", block_n=192, stream_k=True), ["power-of-two block_n", "block_n=192"]),
        (
            dict(block_n=192),
            ["block_n=192", "with kernel='gluon_ws' block_n may also be a sum of two powers"],
        ),
        (dict(kernel="tma_persistent", block_n=192), ["block_n=192", "powers of two"]),
    ],
    ids=str,
)
def test_options_run_only_on_their_kernels(fields, words):
    with pytest.raises(ConfigError) as info:
        TileConfig(**fields)
    message = str(info.value)
    assert all(w in message for w in words), message


def test_each_option_is_valid_on_its_kernels():
    """The other side of the rules: every kernel of an option's list takes it."""
    for kernel in STREAM_K_KERNELS:
        assert TileConfig(kernel=kernel, stream_k=True).decomposition == "stream_k"
    for kernel in SPLIT_K_KERNELS:
        assert TileConfig(16, 16, 64, 8, 4, 1, kernel=kernel, split_k=2, split_k_inline=True).split_k == 2
    for kernel in TMA_KERNELS:
        assert TileConfig(kernel=kernel, epilogue_subtile=True).uses_tma
    assert TileConfig(128, 192, 64, 8, 8, 4, kernel="gluon_ws").accumulator_widths == (128, 64)
    assert TileConfig(64, 128, 64, 8, 4, 3, kernel="gluon_ws", pingpong=True, cluster_m=1).pingpong
    assert set(KERNELS) == set(launch.LAUNCHERS) - {"stream_k"}  # one launcher per kernel, and Stream-K's


@pytest.mark.parametrize(
    "cfg, launcher",
    [
        (TileConfig(), "pointer"),
        (TileConfig(stream_k=True), "stream_k"),
        (TileConfig(split_k=2), "pointer"),
        (TileConfig(kernel="tma"), "tma"),
        (TileConfig(kernel="tma_persistent", stream_k=True), "tma_persistent"),
        (TileConfig(kernel="gluon_ws", stream_k=True), "gluon_ws"),
        (TileConfig(16, 8, 64, 8, 4, 1, kernel="gemv", split_k=2), "gemv"),
    ],
    ids=str,
)
def test_launcher_is_the_kernel_but_for_the_pointer_kernels_stream_k(cfg, launcher):
    assert cfg.launcher == launcher
    assert f"kernel       : {launcher}" in cfg.describe()
    assert TileConfig.from_dict(cfg.to_dict()) == cfg


def test_without_warp_specialization_moves_only_the_gluon_kernel():
    ws = TileConfig(128, 192, 64, 8, 4, 5, kernel="gluon_ws", pingpong=True, stream_k=False)
    assert ws.without_warp_specialization() == TileConfig(128, 128, 64, 8, 4, 5, kernel="tma_persistent")
    for cfg in (TileConfig(), TileConfig(kernel="tma"), TileConfig(16, 8, 64, 8, 4, 1, kernel="gemv")):
        assert cfg.without_warp_specialization() == cfg


# ----------------------------------------------------------------------------------
# Budgets: shared memory and accumulator registers, with the numbers in the message
# ----------------------------------------------------------------------------------
def test_shared_memory_budget_names_budget_and_excess():
    cfg = TileConfig(256, 256, 64, 8, 8, 4)  # 4 x (256x64 + 64x256) x 2 B = 262144 B
    need = 4 * (256 * 64 + 64 * 256) * 2
    assert cfg.smem_bytes(2) == need
    budget = INTERPRETER_DEVICE.smem_per_block
    with pytest.raises(ConfigError) as info:
        cfg.validate(INTERPRETER_DEVICE, elem_size=2)
    message = str(info.value)
    for number in (need, budget, need - budget):
        assert str(number) in message, f"{number} missing from: {message}"
    assert "shared memory" in message and INTERPRETER_DEVICE.name in message


def test_shared_memory_depends_on_dtype_and_stages():
    """The same tiles fit in fp16 and not in fp32 on a 48 KiB device; fewer stages fit again."""
    cfg = TileConfig(64, 64, 64, 8, 4, 3)  # 3 x 8192 elements: 48 KiB at 2 B, 96 KiB at 4 B
    assert cfg.validate(SMALL_GPU, elem_size=2) is cfg
    with pytest.raises(ConfigError, match=str(3 * 8192 * 4 - 48 * 1024)):
        cfg.validate(SMALL_GPU, elem_size=4)
    assert cfg.with_pipeline("single_stage").validate(SMALL_GPU, elem_size=4)


def test_register_budget_names_budget_and_excess():
    cfg = TileConfig(256, 256, 16, 8, 4, 1)  # 65536 accumulators over 128 threads = 512 each
    assert cfg.thread_fragment == 512
    with pytest.raises(ConfigError) as info:
        cfg.validate(INTERPRETER_DEVICE, elem_size=2)
    message = str(info.value)
    for number in (512, ACCUMULATOR_REGISTER_BUDGET, 512 - ACCUMULATOR_REGISTER_BUDGET):
        assert re.search(rf"\b{number}\b", message), f"{number} missing from: {message}"
    assert "register" in message
    # Twice the warps halve the fragment: 256 fits.
    with pytest.raises(ConfigError, match="256 accumulator registers"):
        dataclasses.replace(cfg, num_warps=8).validate(INTERPRETER_DEVICE)
    assert dataclasses.replace(cfg, num_warps=16).validate(INTERPRETER_DEVICE)


def test_fp64_accumulators_take_two_registers_each():
    cfg = TileConfig(128, 128, 16, 8, 4, 2)  # 128 accumulators per thread: 128 regs fp32, 256 fp64
    assert cfg.validate(INTERPRETER_DEVICE, elem_size=4, acc_size=4)
    with pytest.raises(ConfigError, match="256 accumulator registers"):
        cfg.validate(INTERPRETER_DEVICE, elem_size=8, acc_size=8)


def test_too_many_threads_for_the_tile():
    with pytest.raises(ConfigError, match="without accumulators"):
        TileConfig(16, 16, 16, 8, 16, 2).validate(INTERPRETER_DEVICE)


# ----------------------------------------------------------------------------------
# Values: printable, hashable, convertible
# ----------------------------------------------------------------------------------
def test_describe_shows_every_level():
    text = TileConfig(128, 256, 64, 8, 8, 3).describe(elem_size=2)
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()[1:]}
    assert "128 x 256" in lines["CTA tile"] and "K step 64" in lines["CTA tile"]
    assert "GROUP_M=8" in lines["CTA tile"]
    assert (
        "8 warps" in lines["warp level"]
        and "2 x 4" in lines["warp level"]
        and "64 x 64" in lines["warp level"]
    )
    assert "128 fp32 accumulators per thread" in lines["thread level"]
    smem_kib = 3 * (128 * 64 + 64 * 256) * 2 // 1024  # 144
    assert "multi_stage" in lines["pipeline"] and "num_stages=3" in lines["pipeline"]
    assert f"{smem_kib} KiB" in lines["pipeline"]
    assert "single_stage" in TileConfig(num_stages=1).describe()
    assert "double_buffer" in TileConfig(num_stages=2).describe()


@pytest.mark.parametrize(
    "cfg, warp_grid, warp_tile",
    [
        pytest.param(TileConfig(16, 16, 16, 1, 1, 1), (1, 1), (16, 16), id="16x16-w1"),
        pytest.param(TileConfig(64, 32, 128, 4, 2, 2), (2, 1), (32, 32), id="64x32-w2"),
        pytest.param(TileConfig(128, 16, 32, 8, 8, 6), (8, 1), (16, 16), id="128x16-w8"),
        pytest.param(TileConfig(128, 256, 64, 8, 8, 3), (2, 4), (64, 64), id="128x256-w8"),
    ],
)
def test_warp_split_covers_the_tile(cfg, warp_grid, warp_tile):
    """Each factor of two of the warps goes to the dimension whose warp tile is larger."""
    assert cfg.warp_grid == warp_grid
    assert cfg.warp_tile == warp_tile
    assert warp_grid[0] * warp_tile[0] == cfg.block_m and warp_grid[1] * warp_tile[1] == cfg.block_n
    assert cfg.thread_fragment * 32 * cfg.num_warps == cfg.block_m * cfg.block_n


def test_value_semantics():
    cfg = TileConfig(64, 128, 32, 8, 4, 3)
    assert hash(cfg) == hash(TileConfig(64, 128, 32, 8, 4, 3))
    assert {cfg: "x"}[TileConfig(64, 128, 32, 8, 4, 3)] == "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.block_m = 32
    assert TileConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown fields"):
        TileConfig.from_dict({**cfg.to_dict(), "block_z": 16})
    assert "64x128x32" in cfg.short() and "s3" in cfg.short()
    triton_cfg = cfg.to_triton()
    assert triton_cfg.kwargs["BLOCK_M"] == 64 and triton_cfg.num_stages == 3 and triton_cfg.num_warps == 4


# ----------------------------------------------------------------------------------
# The candidate space
# ----------------------------------------------------------------------------------
PROBLEMS = {
    "fp16-4096": GemmProblem(4096, 4096, 4096, dtype="float16"),
    "bf16-ragged": GemmProblem(1000, 3000, 700, dtype="bfloat16", layout="NT"),
    "fp32-1024": GemmProblem(1024, 1024, 1024, dtype="float32"),
    "fp16-decode": GemmProblem(16, 4096, 4096, dtype="float16", layout="NT"),
}


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_candidate_configs_are_a_few_dozen_valid_configs(name):
    problem = PROBLEMS[name]
    configs = list(candidate_configs(problem, INTERPRETER_DEVICE))
    assert 12 <= len(configs) <= 100, f"{len(configs)} candidates"
    assert len(set(configs)) == len(configs), "duplicates"
    pipelines = {c.pipeline for c in configs}
    assert pipelines >= {"double_buffer", "multi_stage"}
    k_tiles = {c: -(-problem.k // c.block_k) for c in configs}
    for c in configs:
        assert c.validate(INTERPRETER_DEVICE, problem.elem_size, problem.acc_size) is c
        # rule 1: a tile at most the problem's size rounded up to a power of two (>= 16)
        assert c.block_m <= max(16, 1 << (problem.m - 1).bit_length())
        assert c.block_n <= max(16, 1 << (problem.n - 1).bit_length())
        # rule 3: every warp has at least a 16x16 tile
        assert c.block_m * c.block_n >= c.num_warps * 256
        # rule 4: deep pipelines only with as many K-tiles
        assert c.num_stages <= 2 or c.num_stages <= k_tiles[c] + 1


def test_candidate_configs_offer_the_warp_specialized_tiles_on_sm90_only():
    """Rule 7: on an H100 (2-byte types, one matrix) the Gluon kernel's measured tiles, ping-pong
    included, are candidates that fit its shared memory; not on an A100, for fp32, or for a batch."""
    from tritongemm.device import KNOWN_DEVICES
    from tritongemm.planning.eligibility import warp_specialized_shared_bytes
    from tritongemm.tuning.space import WARP_SPECIALIZED_TILES

    h100, a100 = KNOWN_DEVICES["h100"], KNOWN_DEVICES["a100"]
    problem = GemmProblem(4096, 4096, 4096, dtype="bfloat16", layout="NT")
    ws = [c for c in candidate_configs(problem, h100) if c.kernel == "gluon_ws"]
    tiles = {(c.block_m, c.block_n, c.num_warps, c.num_stages, c.pingpong, c.epilogue_subtile) for c in ws}
    assert tiles == set(WARP_SPECIALIZED_TILES)
    # Rule 2: where a TMA config's whole store buffer does not fit, its half does (128x256 at 4 stages).
    deep = TileConfig(128, 256, 64, 8, 8, 4, kernel="tma_persistent")
    assert deep.smem_bytes(2) > h100.smem_per_block
    assert dataclasses.replace(deep, epilogue_subtile=True) in candidate_configs(problem, h100)
    assert any(c.pingpong for c in ws) and any(not c.pingpong for c in ws)
    assert all(warp_specialized_shared_bytes(c) <= h100.smem_per_block for c in ws)
    for other, dev in (
        (problem, a100),
        (GemmProblem(4096, 4096, 4096, dtype="float32", layout="NT"), h100),
        (GemmProblem(4096, 4096, 4096, dtype="bfloat16", layout="NT", batch=4), h100),
    ):
        assert not [c for c in candidate_configs(other, dev) if c.kernel == "gluon_ws"], (other, dev.name)


def test_candidate_configs_respect_a_small_device():
    problem = PROBLEMS["bf16-ragged"]
    configs = list(candidate_configs(problem, SMALL_GPU))
    assert configs, "a 48 KiB device still has candidates"
    assert all(c.smem_bytes(problem.elem_size) <= SMALL_GPU.smem_per_block for c in configs)
    assert len(configs) < len(list(candidate_configs(problem, INTERPRETER_DEVICE)))


def test_candidate_configs_never_empty_on_a_small_device():
    """fp32 on 48 KiB (device.py's fallback when the opt-in limit is unknown) still has candidates."""
    assert list(candidate_configs(PROBLEMS["fp32-1024"], SMALL_GPU))


def test_candidate_configs_small_problem_has_small_tiles():
    configs = list(candidate_configs(GemmProblem(20, 40, 24, dtype="float16"), INTERPRETER_DEVICE))
    assert configs
    assert all(c.block_m <= 32 and c.block_n <= 64 and c.block_k <= 32 for c in configs)
    assert all(c.num_stages <= 2 for c in configs)  # K=24 is one K-tile of 32


def test_candidate_configs_float64_space_is_not_degenerate():
    """fp64 gets a real space (small tiles for its 2-register accumulators), the heuristic's pick included."""
    problem = GemmProblem(4096, 4096, 4096, dtype="float64")
    configs = list(candidate_configs(problem, INTERPRETER_DEVICE))
    heuristic = tritongemm.heuristic_config(problem, INTERPRETER_DEVICE)
    assert len(configs) >= 12 and heuristic in configs, f"{len(configs)} candidates: {configs}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 1), (17, 31, 65), (4096, 4096, 4096), (1, 11008, 4096)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_heuristic_config_is_valid(shape, dtype):
    problem = GemmProblem(*shape, dtype=dtype)
    cfg = tritongemm.heuristic_config(problem, INTERPRETER_DEVICE)
    assert cfg.validate(INTERPRETER_DEVICE, problem.elem_size, problem.acc_size) is cfg
    assert tritongemm.select_config(problem, INTERPRETER_DEVICE) == cfg
    assert tritongemm.select_config(problem, INTERPRETER_DEVICE, pipeline="single_stage").num_stages == 1


GPUS = {
    "h100": DeviceInfo(name="H100", capability=(9, 0), sm_count=132, smem_per_block=232448),
    "a100": DeviceInfo(name="A100", capability=(8, 0), sm_count=108, smem_per_block=166912),
    "small": SMALL_GPU,
}
GPU_SHAPES = [
    (1, 1, 1),
    (1, 7, 3),
    (1, 1, 4096),
    (1, 4096, 1),
    (2, 3, 5),
    (17, 31, 65),
    (64, 64, 16),
    (1, 11008, 4096),
    (16, 4096, 4096),
    (128, 8192, 8192),
    (896, 2432, 4096),
    (512, 512, 65536),
    (256, 256, 131072),
    (1024, 1024, 32768),
    (4096, 4096, 4096),
]


@pytest.mark.parametrize(
    ("shape", "layout", "expected"),
    [
        (
            (256, 256, 131072),
            "NN",
            "64x64x128 g8 w4 s5 splitk8i",
        ),  # 4 tiles of 128x128: small tiles, 8 slices
        ((256, 256, 65536), "NT", "64x64x128 g8 w4 s5 splitk8i"),
        (
            (1024, 1024, 32768),
            "NN",
            "128x128x64 g8 w8 s6 splitk2i",
        ),  # B row-major: the pointer kernel's split
        ((1024, 1024, 32768), "NT", "128x128x64 g8 w4 s4 tma+persistent+ws+streamk"),  # B column-major
        ((512, 512, 65536), "NT", "128x128x64 g8 w8 s6 splitk8i"),
    ],
)
def test_long_k_rules_on_the_h100(shape, layout, expected):
    """Long K over few tiles picks what the sweep measured best (sweeps/longk_sweep.json)."""
    problem = GemmProblem(*shape, dtype="bfloat16", layout=layout)
    assert tritongemm.heuristic_config(problem, GPUS["h100"]).short() == expected


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_gpu_heuristic_configs_are_valid(gpu, dtype):
    # The heuristic's GPU branch (never taken on the interpreter) must produce a
    # config that validates for every shape class, tiny ones included, and so
    # must each forced pipeline and decomposition.
    device = GPUS[gpu]
    for shape in GPU_SHAPES:
        for batch in (1, 3):
            problem = GemmProblem(*shape, batch=batch, dtype=dtype)
            cfg = tritongemm.heuristic_config(problem, device)
            assert cfg.validate(device, problem.elem_size, problem.acc_size) is cfg, (shape, batch)
            for pipeline in ("single_stage", "double_buffer", "multi_stage"):
                tritongemm.select_config(problem, device, pipeline=pipeline)
            for decomposition in ("sliced_k", "split_k", "stream_k"):
                tritongemm.select_config(problem, device, decomposition=decomposition)
