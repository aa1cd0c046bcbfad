"""The doors users call: torch's matmul family (``api``), the gated GEMM of GLU MLPs (``gated``),
``nn.Linear``/``nn.GatedMLP``/``convert`` (``nn``; the MLPs it fuses: ``fusion``), ``patch()``, fp8
``scaled_mm`` and fp8 training (``float8``), and ``explain``."""
