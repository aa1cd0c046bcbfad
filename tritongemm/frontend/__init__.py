"""The doors users call: torch's matmul family (``api``), ``nn.Linear``/``convert``, ``patch()``,
fp8 ``scaled_mm`` and fp8 training (``float8``), and ``explain``."""
