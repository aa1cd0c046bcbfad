"""The tiling hierarchy as values: ``TileConfig`` (its pipeline schemes: ``pipelines``).

A GEMM C[M, N] = A[M, K] · B[K, N] is cut into levels, as in CUTLASS:

* **CTA (threadblock) tile** ``block_m × block_n``: one Triton program computes
  one such tile of C, walking K in steps of ``block_k``.  ``group_m`` orders the
  tiles in groups of ``group_m`` rows so that programs running together share
  A and B tiles in L2 ("swizzled" order).
* **Warp level**: ``num_warps`` warps share the CTA tile; each owns a warp tile
  of about ``block_m/warps_m × block_n/warps_n``.  Triton picks the exact warp
  layout; ``warp_grid`` shows the split we expect.
* **Thread level**: each thread holds a fragment of
  ``block_m*block_n / (32*num_warps)`` fp32 accumulators in registers.
* **Pipeline** ``num_stages``: how many K-tiles of A and B live in shared memory
  at once, i.e. which mainloop scheme runs (see ``PIPELINES``).

Beside the levels, a config names its ``kernel`` and that kernel's options (which
kernel takes which: ``config_rules``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from ..device import DeviceInfo
from .config_rules import (  # noqa: F401  (re-exported: what a config may name, beside the config)
    KERNELS,
    LEGACY_KERNEL_FLAGS,
    MAX_SPLIT_K,
    SPLIT_K_KERNELS,
    STREAM_K_KERNELS,
    TMA_KERNELS,
    check_config,
    migrate_kernel_flags,
    split_width,
)
from .pipelines import (  # noqa: F401  (re-exported: the tiling hierarchy's values in one place)
    MAX_STAGES,
    MIN_STAGES,
    PIPELINES,
    ConfigError,
    pipeline_name,
    resolve_pipeline,
)

#: Ways to share the K loop among programs (see TileConfig.decomposition).
DECOMPOSITIONS = ("sliced_k", "split_k", "stream_k")

#: Registers a thread may spend on its accumulator fragment.  A thread has 255
#: registers; the rest hold addresses, loop counters and the operand fragments
#: that feed the tensor cores, so we keep about a quarter back.
ACCUMULATOR_REGISTER_BUDGET = 192


#: What ``short()`` prints for each kernel: before the ``kernel`` field, the booleans that chose it
#: printed these words (tma, persistent, ws; gemv after the options), and result CSVs hold them.
_SHORT_KERNEL_WORDS = {
    "tma": ("tma",),
    "tma_persistent": ("tma", "persistent"),
    "gluon_ws": ("tma", "persistent", "ws"),
}


@dataclass(frozen=True)
class TileConfig:
    """One point of the tiling hierarchy; hashable, printable, validated.

    >>> TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3).pipeline
    'multi_stage'
    """

    # CTA tile
    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    group_m: int = 8
    # warp level
    num_warps: int = 4
    # pipeline
    num_stages: int = 3
    # the kernel, one of KERNELS: "pointer"; on Hopper "tma" (data-parallel grid), "tma_persistent",
    # "gluon_ws" (warp-specialized, persistent); "gemv" (one row of A: programs own block_n outputs and
    # walk K in block_k steps, no tensor cores, block_m unused).  Where the operands don't allow it
    # the plan falls back to a kernel they do (``plan.Plan.fallback`` says why).
    kernel: str = "pointer"
    # on the TMA kernels: the epilogue stored in two halves.
    epilogue_subtile: bool = False
    # with gluon_ws: two consumer warpgroups of num_warps=4 each on alternate tiles, so one's
    # epilogue runs under the other's mainloop (CUTLASS's ping-pong); without it the consumer warps
    # share every tile (one warpgroup, or CUTLASS's cooperative with num_warps=8).
    pingpong: bool = False
    # with gluon_ws: a cluster of cluster_m x cluster_n CTAs (two at most) that run neighbouring
    # tiles along M (N) and share their B (A) box: one TMA multicast writes it into both CTAs' shared
    # memory, halving that operand's L2 traffic (CUTLASS's ClusterShape).  Needs a Triton whose Gluon
    # has CGA layouts and multicast (3.7+; kernels.gluon_common.CLUSTER_AVAILABLE).
    cluster_m: int = 1
    cluster_n: int = 1
    # work decomposition: K cut into split_k slices run by separate programs
    # (pointer and GEMV kernels), partials reduced in a fixed order: by a second kernel
    # (CUTLASS's "parallel" split-K), or, with split_k_inline, by the last
    # slice of each tile to finish, in the same launch.
    split_k: int = 1
    split_k_inline: bool = False
    # Stream-K: a persistent grid sharing all MAC iterations evenly (pointer, tma_persistent and
    # gluon_ws each have their own).
    stream_k: bool = False

    def __post_init__(self) -> None:
        check_config(self)

    # -- the levels of the hierarchy ------------------------------------------------
    @property
    def pipeline(self) -> str:
        return pipeline_name(self.num_stages)

    @property
    def warp_grid(self) -> tuple[int, int]:
        """How we expect the warps to split the CTA tile (warps_m, warps_n)."""
        warps_m, warps_n = 1, 1
        # Give each new factor of two to the dimension whose warp tile is larger.
        while warps_m * warps_n < self.num_warps:
            if self.block_m // warps_m >= self.block_n // warps_n and self.block_m // warps_m > 16:
                warps_m *= 2
            else:
                warps_n *= 2
        return warps_m, warps_n

    @property
    def warp_tile(self) -> tuple[int, int]:
        warps_m, warps_n = self.warp_grid
        return max(self.block_m // warps_m, 1), max(self.block_n // warps_n, 1)

    @property
    def thread_fragment(self) -> int:
        """Accumulator elements each thread keeps in registers."""
        # (GEMV accumulates a block_k x block_n tile)
        rows = self.block_k if self.kernel == "gemv" else self.block_m
        return rows * self.block_n // (32 * self.num_warps)

    def splits_rows(self, elem_size: int) -> bool:
        """Do two consumers split each tile's rows (the Gluon kernel's SPLIT_ROWS: fp8 ping-pong), each
        holding and staging half the tile, rather than take whole tiles in turn?"""
        return self.pingpong and elem_size == 1

    def smem_bytes(self, elem_size: int) -> int:
        """Shared memory: one A and one B tile per stage (+ the TMA store's staging tile)."""
        stages = max(self.num_stages, 1)
        a_rows = 1 if self.kernel == "gemv" else self.block_m
        mainloop = stages * (a_rows * self.block_k + self.block_k * self.block_n) * elem_size
        epilogue = 0
        # the TMA store stages C (or half of it; one per ping-pong consumer) in shared memory
        if self.uses_tma:
            epilogue = self.block_m * self.block_n * elem_size // (2 if self.epilogue_subtile else 1)
            epilogue *= 2 if self.pingpong and not self.splits_rows(elem_size) else 1
        return mainloop + epilogue

    def accumulator_registers(self, acc_size: int = 4) -> int:
        return self.thread_fragment * acc_size // 4

    @property
    def accumulator_widths(self) -> tuple[int, int]:
        """The warp-specialized kernel's accumulators per tile, as widths (second 0 for none): a two-part
        width's parts (192 -> 128 + 64), with ``epilogue_subtile`` the halves (256 -> 128 + 128)."""
        if self.epilogue_subtile and self.kernel == "gluon_ws":
            return self.block_n // 2, self.block_n // 2
        return split_width(self.block_n)

    # -- conversions -------------------------------------------------------------------
    def without_warp_specialization(self) -> TileConfig:
        """The nearest config for the TMA kernel: ``gluon_ws`` becomes ``tma_persistent`` (other kernels
        stay), without ping-pong consumers or clusters, on a power-of-two ``block_n`` (a two-part width
        such as 192 keeps its larger part, 128)."""
        return replace(
            self,
            kernel="tma_persistent" if self.kernel == "gluon_ws" else self.kernel,
            pingpong=False,
            cluster_m=1,
            cluster_n=1,
            block_n=split_width(self.block_n)[0],
        )

    def with_pipeline(self, pipeline: str | int) -> TileConfig:
        """The same tiles under another mainloop scheme (name or stage count)."""
        stages = resolve_pipeline(pipeline, default_multi=max(self.num_stages, 3))
        return replace(self, num_stages=stages)

    def to_triton(self):
        import triton

        return triton.Config(
            {
                "BLOCK_M": self.block_m,
                "BLOCK_N": self.block_n,
                "BLOCK_K": self.block_k,
                "GROUP_M": self.group_m,
            },
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )

    def to_dict(self) -> dict[str, int | bool | str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TileConfig:
        """The config of ``to_dict``'s fields; a dict written before the ``kernel`` field, with the
        booleans that chose the kernel, is read as the kernel they chose (``migrate_kernel_flags``)."""
        data = migrate_kernel_flags(data)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"TileConfig: unknown fields {sorted(unknown)}")
        return cls(**data)

    @property
    def decomposition(self) -> str:
        """How K work is shared: 'sliced_k' (default), 'split_k' or 'stream_k'."""
        if self.stream_k:
            return "stream_k"
        return "split_k" if self.split_k > 1 else "sliced_k"

    @property
    def uses_tma(self) -> bool:
        """Does the kernel load and store through TMA descriptors (``TMA_KERNELS``)?"""
        return self.kernel in TMA_KERNELS

    @property
    def launcher(self) -> str:
        """The launcher this config asks for, one of ``launch.LAUNCHERS``' six: the kernel's name
        (``pointer``, ``tma``, ``tma_persistent``, ``gluon_ws``, ``gemv``; the TMA ones with their own
        Stream-K), but ``stream_k`` for the pointer kernel's Stream-K, a kernel of its own.  The plan
        runs it where the operands allow, else the config's fallback (``plan.Plan.fallback`` says why)."""
        return "stream_k" if self.kernel == "pointer" and self.stream_k else self.kernel

    def short(self) -> str:
        flags = list(_SHORT_KERNEL_WORDS.get(self.kernel, ()))
        flags += [
            name for name, on in (("pingpong", self.pingpong), ("subtile", self.epilogue_subtile)) if on
        ]
        if self.cluster_m * self.cluster_n > 1:
            flags.append(f"cluster{self.cluster_m}x{self.cluster_n}")
        if self.split_k > 1:
            flags.append(f"splitk{self.split_k}" + ("i" if self.split_k_inline else ""))
        if self.stream_k:
            flags.append("streamk")
        if self.kernel == "gemv":
            flags.append("gemv")
        return (
            f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} "
            f"w{self.num_warps} s{self.num_stages}" + (" " + "+".join(flags) if flags else "")
        )

    def describe(self, elem_size: int = 2) -> str:
        wm, wn = self.warp_grid
        tm, tn = self.warp_tile
        return "\n".join(
            [
                f"TileConfig ({self.pipeline}, {self.short()})",
                f"  CTA tile     : {self.block_m} x {self.block_n}, K step {self.block_k}, "
                f"grouped order GROUP_M={self.group_m}",
                f"  warp level   : {self.num_warps} warps ~ {wm} x {wn}, warp tile ~ {tm} x {tn}",
                f"  thread level : {self.thread_fragment} fp32 accumulators per thread",
                f"  pipeline     : {self.pipeline}, num_stages={self.num_stages}, "
                f"{self.smem_bytes(elem_size) / 1024:.0f} KiB shared memory at {elem_size} B/element",
                f"  decomposition: {self.decomposition}"
                + (f" x{self.split_k}" if self.split_k > 1 else "")
                + (
                    ", reduced in-kernel by each tile's last slice"
                    if self.split_k_inline
                    else ", reduced by a second kernel"
                    if self.split_k > 1
                    else ""
                ),
                f"  kernel       : {self.launcher}"
                + (
                    " (warp-specialized, ping-pong consumers)"
                    if self.pingpong
                    else " (warp-specialized)"
                    if self.kernel == "gluon_ws"
                    else ""
                )
                + (" (epilogue in two halves)" if self.epilogue_subtile else "")
                + (
                    f" (clusters of {self.cluster_m}x{self.cluster_n} CTAs sharing "
                    f"{'B' if self.cluster_m > 1 else 'A'} by TMA multicast)"
                    if self.cluster_m * self.cluster_n > 1
                    else ""
                ),
            ]
        )

    def validate(self, device: DeviceInfo, elem_size: int = 2, acc_size: int = 4) -> TileConfig:
        """Raise ``ConfigError`` naming the budget this config exceeds on ``device``."""
        smem = self.smem_bytes(elem_size)
        if smem > device.smem_per_block:
            raise ConfigError(
                f"{self.short()}: shared memory {smem} B = {self.num_stages} stages x "
                f"({self.block_m}x{self.block_k} + {self.block_k}x{self.block_n}) x {elem_size} B "
                f"exceeds {device.name}'s {device.smem_per_block} B per block "
                f"by {smem - device.smem_per_block} B"
            )
        regs = self.accumulator_registers(acc_size)
        if self.splits_rows(elem_size):
            regs //= 2
        if regs > ACCUMULATOR_REGISTER_BUDGET:
            raise ConfigError(
                f"{self.short()}: {regs} accumulator registers per thread "
                f"({self.block_m}x{self.block_n} over {32 * self.num_warps} threads) exceeds the "
                f"budget of {ACCUMULATOR_REGISTER_BUDGET} by {regs - ACCUMULATOR_REGISTER_BUDGET}; "
                "use more warps or a smaller tile"
            )
        if self.thread_fragment < 1:
            raise ConfigError(
                f"{self.short()}: {32 * self.num_warps} threads for a "
                f"{self.block_k if self.kernel == 'gemv' else self.block_m}x{self.block_n} accumulator tile "
                "leaves threads without accumulators"
            )
        return self
