"""Which torch and Triton releases tritongemm runs on, checked once at import.

The floors come from running the suite (README, "Supported versions"):

* Triton 3.0 and 3.1 return wrong products without an error; 3.2 to 3.4 reject
  a float64 ``tl.dot`` ("Unsupported lhs dtype fp64"), and float64 is a dtype
  tritongemm serves.  3.5 compiles every kernel for sm_90
  (``tools/offline_compile.py``), but its interpreter checks TMA descriptor
  strides in elements instead of bytes and fails 36 TMA-kernel tests.  3.6 (the
  GPU image's) is the first that passes everything it was run on.
* torch 2.4 cannot register the custom op (``torch.library.custom_op`` raises
  ValueError on its signature); torch 2.6 pairs with Triton 3.2.  torch 2.10 is
  the first release whose own Triton pin (3.6.0) is in range (2.10 itself is
  untested; 2.11 and 2.13 are).

Newer releases than the tested ones are let through: a floor is a known break,
a ceiling would only be a guess.
"""

from __future__ import annotations

import re

from ._version import __version__

MIN_TORCH = (2, 10)
MIN_TRITON = (3, 6)
#: What the test suite has been run with (README, "Supported versions").
TESTED = "torch 2.11 + triton 3.6 on an H100; torch 2.13 (CPU) + triton 3.6 to 3.9 on the interpreter"

_TRITON_BREAKS = {
    (3, 0): "it returns wrong products without an error",
    (3, 1): "it returns wrong products without an error",
    (3, 2): "it rejects float64 dot products",
    (3, 3): "it rejects float64 dot products",
    (3, 4): "it rejects float64 dot products",
    (3, 5): "its CPU interpreter rejects the TMA kernel's tensor descriptors; untested on a GPU",
}


def _release(version: str) -> tuple[int, int] | None:
    """(major, minor) of "2.13.0+cpu", "3.6.0", "2.11.0a0+git5f3e"; None when unreadable."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def _dotted(release: tuple[int, int]) -> str:
    return ".".join(map(str, release))


def unsupported_reasons(torch_version: str, triton_version: str) -> list[str]:
    """Why this torch / Triton pair is below the supported floor (empty: it is not).

    An unreadable version string (a local build) is given the benefit of the doubt.
    """
    reasons = []
    triton_release = _release(triton_version)
    if triton_release is not None and triton_release < MIN_TRITON:
        why = _TRITON_BREAKS.get(triton_release, "it predates the kernels' Triton API")
        reasons.append(f"triton {triton_version} is older than {_dotted(MIN_TRITON)} ({why})")
    torch_release = _release(torch_version)
    if torch_release is not None and torch_release < MIN_TORCH:
        reasons.append(f"torch {torch_version} is older than {_dotted(MIN_TORCH)}")
    return reasons


def check_versions(torch_version: str | None = None, triton_version: str | None = None) -> None:
    """Raise ImportError naming the installed and the supported versions if either is too old.

    Without arguments, checks the installed torch and Triton.
    """
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    if triton_version is None:
        import triton

        triton_version = triton.__version__
    reasons = unsupported_reasons(str(torch_version), str(triton_version))
    if reasons:
        raise ImportError(
            f"tritongemm {__version__} does not support the installed versions: {'; '.join(reasons)}. "
            f"It needs torch >= {_dotted(MIN_TORCH)} and triton >= {_dotted(MIN_TRITON)} "
            f"(tested: {TESTED}). Upgrade, e.g. pip install 'torch>={_dotted(MIN_TORCH)}' "
            f"'triton>={_dotted(MIN_TRITON)}' (each torch release pins the Triton it was built with)."
        )


def interpreter_numpy_problem(triton_version: str, numpy_version: str) -> str | None:
    """Why Triton's CPU interpreter cannot run with this numpy (None when it can, or when unknown).

    Triton 3.6's interpreter converts 1-element arrays to Python ints, which
    numpy 2.4 made an error; Triton 3.9's runs (3.7 and 3.8 are unchecked).
    """
    triton_release, numpy_release = _release(triton_version), _release(numpy_version)
    if triton_release is None or numpy_release is None:
        return None
    if triton_release <= (3, 6) and numpy_release >= (2, 4):
        return interpreter_numpy_message(triton_version, numpy_version)
    return None


def interpreter_numpy_message(triton_version: str, numpy_version: str) -> str:
    """The words for that failure (also raised when a launch hits it on an unchecked Triton)."""
    return (
        f"Triton {triton_version}'s interpreter cannot run with numpy {numpy_version}: it converts "
        "1-element arrays to Python ints, which numpy 2.4 made an error. Install numpy<2.4 or a "
        "newer triton (3.9 works) to use TRITON_INTERPRET=1."
    )


# Run on import (tritongemm/__init__.py imports this module first).
check_versions()
