"""Run a GEMM on aligned copies of its unaligned operands (the "pad" path of docs/unaligned.md).

A leading dimension that is not a multiple of 16 bytes rules out TMA and
cp.async, and the kernels then load element by element.  When the plan says
a copy pays (``plan.Alignment``, ``unaligned.padding_estimate``), this
launcher copies those operands, per call, into workspaces whose leading
dimension is rounded up to 16 bytes (only the leading dimension: the
kernels mask, and TMA zero-fills, everything past the logical shape, so the
padding is never read and needs no zeroing), runs the aligned kernel on
them, and, when C was the unaligned one, copies the result out.

Per call: one ``torch.empty`` holds every workspace of one dtype (A's and B's;
C's and the pre-activation's), one launch of ``kernels.pad_copy`` copies A and
B in, the GEMM runs, and one more copies C (and the pre-activation) out.
Everything about shapes and strides is fixed when the launcher is built, so a
call reads only its tensors' data pointers (``takes_bases``: the repeated-call
fast path can use it).  Operands whose batch dims do not collapse to one
stride, or an inner kernel that needs views, take torch's ``copy_`` on views
instead (and the launcher then reads its tensors' shapes).

Memory: each workspace holds its operand with the leading dimension rounded
up (under 16 bytes more per row or column, a broadcast batch dim stored once),
plus up to ``ALIGN_BYTES`` between workspaces.  It comes from torch's caching
allocator (no cudaMalloc per call, no host sync, safe under CUDA-graph capture)
and is dropped when the call returns: no padded copy of a user's tensor
outlives the call.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from ..kernels import pad_copy_kernel
from ..planning.eligibility import Operand, round_up
from .common import INT32_MAX, KernelArgs, Launch, collapse_batch, needs_index_64

#: Where each workspace of a shared allocation starts (TMA needs 16-byte aligned bases; a whole
#: 128-byte line keeps two workspaces' rows out of one cache line).
ALIGN_BYTES = 128


class Workspace:
    """How one operand is padded: its shape, the orientation kept, which batch dims stay broadcast,
    and where in its call's allocation it lies (``pool``, ``offset`` in elements)."""

    def __init__(self, t: torch.Tensor, row_major: bool | None = None):
        self.shape = tuple(t.shape)
        self.dtype = t.dtype
        self.row_major = Operand.of(t).aligned(row_major).row_major  # the orientation the plan assumed
        per = max(16 // t.element_size(), 1)
        *batch, rows, cols = t.shape
        # A broadcast (stride-0) batch dim is copied once and broadcast again, not materialized.
        self.broadcast = tuple(st == 0 and size != 1 for size, st in zip(batch, t.stride()[:-2]))
        kept = tuple(1 if bc else size for size, bc in zip(batch, self.broadcast))
        lead = round_up(max(cols if self.row_major else rows, 1), per)
        self.buffer_shape = (*kept, rows, lead) if self.row_major else (*kept, cols, lead)
        self.numel = 1
        batch_strides = []
        for size in reversed(self.buffer_shape):
            batch_strides.insert(0, self.numel)
            self.numel *= size
        matrix = (lead, 1) if self.row_major else (1, lead)
        self.strides = (*(0 if bc else st for st, bc in zip(batch_strides, self.broadcast)), *matrix)
        #: Indexes a tensor of the operand's shape down to the batch entries that are stored.
        self.kept_index = tuple(slice(0, 1) if bc else slice(None) for bc in self.broadcast)
        self.pool, self.offset = 0, 0

    def view(self, buf: torch.Tensor) -> torch.Tensor:
        """The workspace in ``buf``, with the operand's shape (broadcast dims of stride 0)."""
        return buf.as_strided(self.shape, self.strides, self.offset)

    def base(self, buf: torch.Tensor) -> torch.Tensor:
        """A tensor whose data pointer is the workspace's (for launchers that read nothing else)."""
        return buf if self.offset == 0 else buf[self.offset :]


def allocate_pools(workspaces) -> list[tuple[int, torch.dtype]]:
    """Place ``workspaces`` in one allocation per dtype (setting their ``pool`` and ``offset``);
    returns each allocation's (elements, dtype)."""
    pools: list[list] = []
    for ws in workspaces:
        pool = next((i for i, (_, dtype) in enumerate(pools) if dtype == ws.dtype), None)
        if pool is None:
            pool = len(pools)
            pools.append([0, ws.dtype])
        step = max(ALIGN_BYTES // ws.dtype.itemsize, 1)
        ws.pool, ws.offset = pool, round_up(pools[pool][0], step)
        pools[pool][0] = ws.offset + ws.numel
    return [(n, dtype) for n, dtype in pools]


# ----------------------------------------------------------------------------------
# The copy kernel's launcher
# ----------------------------------------------------------------------------------
COPY_RUNTIME = ("src0_ptr", "dst0_ptr", "src1_ptr", "dst1_ptr")
#: A tile per program.  H100, bf16, odd leading dimension (graph-replayed copies, 1023^2 to 4097^2
#: and 8191x1023): 32 x 64 at 4 warps was within 10% of the best of six shapes everywhere, and
#: 1.2-2x faster than torch's copy_ from 2047^2 up (3.4 vs 4.0 us at 1023^2).
BLOCK_OUTER, BLOCK_INNER, COPY_WARPS = 32, 64, 4


def rows_fast(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether the copy tile's inner (lane-contiguous) axis is the rows: the source's unit-stride
    axis where it has one (coalesced loads), else the destination's (coalesced stores)."""
    for t in (src, dst):
        rows, cols = t.shape[-2:]
        if t.stride(-1) == 1 and cols > 1:
            return False
        if t.stride(-2) == 1 and rows > 1:
            return True
    return False


class MatrixCopy(NamedTuple):
    """One matrix of a ``pad_copy_kernel`` launch, all but its pointers: (batch, rows, cols) and the
    (batch, row, col) strides of source and destination."""

    rows: int
    cols: int
    batch: int
    src_strides: tuple[int, int, int]
    dst_strides: tuple[int, int, int]
    rows_fast: bool
    index_64: bool

    @classmethod
    def of(cls, src: torch.Tensor, dst: torch.Tensor) -> MatrixCopy | None:
        """``dst[...] = src`` (one shape); None where the batch dims do not collapse to one stride."""
        dims = collapse_batch(tuple(src.shape[:-2]), [src, dst])
        if len(dims) > 1:
            return None
        batch, (sb, db) = dims[0] if dims else (1, [0, 0])
        rows, cols = src.shape[-2:]
        return cls(
            rows,
            cols,
            batch,
            (sb, *src.stride()[-2:]),
            (db, *dst.stride()[-2:]),
            rows_fast(src, dst),
            needs_index_64(src, dst),
        )

    def tiles(self, block: tuple[int, int]) -> int:
        """Programs for ``block`` = (outer, inner) tiles (as ``kernels.pad_copy`` counts them)."""
        outer, inner = (self.cols, self.rows) if self.rows_fast else (self.rows, self.cols)
        return self.batch * triton.cdiv(outer, block[0]) * triton.cdiv(inner, block[1])

    def kernel_args(self, i: int) -> dict:
        """The kernel's arguments for this matrix as its matrix ``i``."""
        args = {f"rows{i}": self.rows, f"cols{i}": self.cols, f"batch{i}": self.batch}
        for side, strides in (("src", self.src_strides), ("dst", self.dst_strides)):
            args.update({f"{side}{i}_s{axis}": st for axis, st in zip("brc", strides)})
        args[f"ROWS_FAST{i}"] = self.rows_fast
        return args


class PadCopy:
    """One launch of ``pad_copy_kernel`` for one or two matrices.

    Called as ``(src0, dst0, src1, dst1)``: only their data pointers are read
    (with one matrix, the second pair is ignored: pass the first again).
    """

    def __init__(
        self,
        first: MatrixCopy,
        second: MatrixCopy | None = None,
        block: tuple[int, int] = (BLOCK_OUTER, BLOCK_INNER),
    ):
        tiles = first.tiles(block) + (second.tiles(block) if second is not None else 0)
        if tiles > INT32_MAX:
            raise RuntimeError(f"pad copy: {tiles} programs exceed the grid limit of 2^31 - 1")
        self.launch = Launch(
            KernelArgs(
                pad_copy_kernel,
                COPY_RUNTIME,
                **first.kernel_args(0),
                **(second or first).kernel_args(1),
                BLOCK_OUTER=block[0],
                BLOCK_INNER=block[1],
                HAS_1=second is not None,
                INDEX_64=first.index_64 or (second is not None and second.index_64),
            ),
            (tiles,),
            COPY_WARPS,
            1,
        )

    def __call__(self, src0, dst0, src1, dst1) -> None:
        self.launch(src0, dst0, src1, dst1)


class Copies:
    """Copies of up to two (source, destination) pairs, e.g. (A, A's workspace) and (B, B's).

    Built on tensors of the layout every call will have; each pair is None
    (nothing to copy) or (source, destination, the ``Workspace`` on either
    side).  Pairs whose batch dims collapse go through one ``PadCopy``; the
    rest through torch's ``copy_`` (``by_pointer`` is then false).
    """

    def __init__(self, pairs):
        self.by_kernel, self.by_torch, described = [], [], []
        for i, pair in enumerate(pairs):
            if pair is None:
                continue
            src, dst, ws = pair
            m = MatrixCopy.of(src[ws.kept_index], dst[ws.kept_index])
            if m is None:
                self.by_torch.append((i, ws.kept_index))
            else:
                self.by_kernel.append(i)
                described.append(m)
        self.launch = PadCopy(*described) if described else None
        self.by_pointer = not self.by_torch

    def __call__(self, *pairs) -> None:
        if self.launch is not None:
            src0, dst0 = pairs[self.by_kernel[0]]
            src1, dst1 = pairs[self.by_kernel[-1]]
            self.launch(src0, dst0, src1, dst1)
        for i, index in self.by_torch:
            src, dst = pairs[i]
            dst[index].copy_(src[index])


class PaddedLauncher:
    """Another kernel's launcher, run on aligned workspaces for the operands the plan names."""

    def __init__(self, plan, call, a, b, out, d, r, z, interpreting: bool, inner_class):
        padded = plan.alignment.padded
        self.device = a.device
        self.a_ws = Workspace(a) if "A" in padded else None
        self.b_ws = Workspace(b) if "B" in padded else None
        self.c_ws = Workspace(out, row_major=True) if "C" in padded else None  # TMA stores rows
        # The kernels store the pre-activation with C's strides: it moves to a workspace with C.
        self.z_is_out = z is out
        self.z_ws = Workspace(z, row_major=True) if self.c_ws is not None and not self.z_is_out else None
        self.pools = allocate_pools([ws for ws in (self.a_ws, self.b_ws, self.c_ws, self.z_ws) if ws])
        # The inner launcher is built once, on workspaces of the layout every call will have.
        wa, wb, wc, wz = self._workspaces(self._allocate(), a, b, out, z, Workspace.view)
        self.inner = inner_class(plan, call, wa, wb, wc, d, r, wz, interpreting)
        self.copy_in = Copies(
            [
                (a, wa, self.a_ws) if self.a_ws else None,
                (b, wb, self.b_ws) if self.b_ws else None,
            ]
        )
        self.copy_out = Copies(
            [
                (wc, out, self.c_ws) if self.c_ws else None,
                (wz, z, self.z_ws) if self.z_ws else None,
            ]
        )
        # Only pointers read per call: the workspaces are passed as bases (no views made).
        self.takes_bases = bool(
            getattr(self.inner, "takes_bases", False) and self.copy_in.by_pointer and self.copy_out.by_pointer
        )
        self.carve = Workspace.base if self.takes_bases else Workspace.view

    def _allocate(self) -> list[torch.Tensor]:
        return [torch.empty(n, dtype=dtype, device=self.device) for n, dtype in self.pools]

    def _workspaces(self, bufs, a, b, out, z, carve):
        wa = carve(self.a_ws, bufs[self.a_ws.pool]) if self.a_ws else a
        wb = carve(self.b_ws, bufs[self.b_ws.pool]) if self.b_ws else b
        wc = carve(self.c_ws, bufs[self.c_ws.pool]) if self.c_ws else out
        if self.z_ws is not None:
            wz = carve(self.z_ws, bufs[self.z_ws.pool])
        else:
            wz = wc if self.z_is_out else z
        return wa, wb, wc, wz

    def __call__(self, a, b, out, d, r, z, alpha, beta):
        wa, wb, wc, wz = self._workspaces(self._allocate(), a, b, out, z, self.carve)
        self.copy_in((a, wa), (b, wb))
        self.inner(wa, wb, wc, d, r, wz, alpha, beta)
        if self.c_ws is not None:
            self.copy_out((wc, out), (wz, z))


class SharedCopy:
    """One unaligned operand copied once into an aligned workspace, for several GEMMs to read in place
    of it: backward's dZ, which each gradient GEMM's ``PaddedLauncher`` would otherwise copy for itself
    (an LM head's 8192 x 30522 dZ: 0.38 ms a copy on an H100).

    Built on a matrix (2-D) of the layout every call will have; ``example()`` is a fresh workspace of
    that layout to plan the GEMMs on (kept by nothing).  A call reads the tensor's data pointer only
    (any tensor over the same memory will do) and returns the aligned copy.
    """

    def __init__(self, t: torch.Tensor):
        self.ws = Workspace(t)
        ((self.numel, self.dtype),) = allocate_pools([self.ws])
        self.device = t.device
        self.launch = PadCopy(MatrixCopy.of(t, self.example()))  # (a matrix has no batch dims to collapse)

    def example(self) -> torch.Tensor:
        return self.ws.view(torch.empty(self.numel, dtype=self.dtype, device=self.device))

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        dst = self.example()
        self.launch(t, dst, t, dst)
        return dst


__all__ = ["MatrixCopy", "PadCopy", "PaddedLauncher", "SharedCopy", "Workspace"]
