"""What a config is chosen for: a GEMM problem's sizes, dtype and layouts, as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass

#: Element sizes of the dtypes a problem may name.
ELEMENT_SIZES = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

#: Spellings accepted for a problem's dtype (the CLI's too), by canonical name.
DTYPE_ALIASES = {
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "fp64": "float64",
    "double": "float64",
    "f64": "float64",
    "fp8": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "fp8_e5m2": "float8_e5m2",
}


def canonical_dtype(dtype) -> str:
    """'float16' for torch.float16, 'fp16', 'half', 'float16', ...; ValueError naming the choices otherwise."""
    name = str(dtype).removeprefix("torch.")
    name = DTYPE_ALIASES.get(name, name)
    if name not in ELEMENT_SIZES:
        raise ValueError(
            f"unsupported dtype {dtype!r}; choose one of {sorted(ELEMENT_SIZES)} (or {sorted(DTYPE_ALIASES)})"
        )
    return name


@dataclass(frozen=True)
class GemmProblem:
    """What a config is chosen for: sizes, dtype and the operands' layouts.

    >>> GemmProblem(4096, 4096, 4096, dtype="bf16").dtype
    'bfloat16'
    """

    m: int
    n: int
    k: int
    batch: int = 1
    #: A canonical name ("float16", ...); a torch dtype or an alias ("fp16", "half") is accepted and converted.
    dtype: str = "float16"
    #: "N" when the operand is row-major (K contiguous for A, N contiguous for B), "T" otherwise.
    layout: str = "NN"

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"GemmProblem.{name} must be an int >= 0, got {value!r}")
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.layout not in ("NN", "NT", "TN", "TT"):
            raise ValueError(f"GemmProblem.layout must be one of NN, NT, TN, TT, got {self.layout!r}")

    @property
    def elem_size(self) -> int:
        return ELEMENT_SIZES[self.dtype]

    @property
    def acc_size(self) -> int:
        return 8 if self.dtype == "float64" else 4

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


def wave_efficiency(tiles: int, sm_count: int) -> float:
    """Busy fraction of the SMs over all waves: 133 tiles on 132 SMs is ~50%."""
    waves = -(-tiles // sm_count)
    return tiles / (waves * sm_count)
