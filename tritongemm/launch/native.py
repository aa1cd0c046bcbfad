"""The compiled part: a C++ autograd node, autocast casts and call keys for the fast path, built on first use.

``csrc/entry_node.cpp`` gives a fast-path entry's output its ``grad_fn`` in
well under a microsecond, where a Python ``autograd.Function`` spends ~3
(``linear`` with grad within 1.2x of torch's host time); and it
casts an entry's operands under ``torch.autocast`` through torch's own
``cached_cast``: its rules and its weight cache, so a weight read several
times in one autocast region is cast (and saved for backward) once, as for
torch's ops (on the H100's host ~9.5 us against ~38 for three ``Tensor.to``
calls from Python when the weight's cast is cached); and it packs a
call's key (``request.fastpath.signature``) in one call.  It is
compiled with the machine's C++ compiler against the installed torch's
headers -- what Triton itself needs at run time to build its launchers --
and cached per source, torch and Python, so a machine builds it once.

When it is built, and what happens until then:

* the first fast-path entry starts the build in a
  background thread (``start()``); calls take the Python ``Function``
  (``fastpath.EntryFunction``) and the Python casts
  (``request.autocast.autocast_cast``) and keys until the module is loaded, then its own.
  Nothing waits for the compiler (~15 s);
* ``build()`` builds (or loads) it now and raises with the compiler's
  output if that fails -- ``tritongemm native`` on the command line, for an
  image that should ship it prebuilt;
* ``TRITONGEMM_NATIVE=0`` never builds nor loads it.

Where it lives: ``$TRITONGEMM_NATIVE_DIR``, else ``native/`` under
``$TRITONGEMM_CACHE_DIR`` or the user cache directory (the tuning cache's),
in a folder named by a hash of everything the binary depends on.  A build
compiles to a temporary file and renames it into place under a file lock:
two processes (ranks of one job) build once, and a crash leaves no half
file.  A failed build leaves ``build.log`` and a ``failed`` marker there;
later processes do not retry it (``build(force=True)`` does).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import warnings
from pathlib import Path

import filelock
import platformdirs
import torch

SOURCE = Path(__file__).parent / "csrc" / "entry_node.cpp"
MODULE_NAME = "_entry_node"  # PyInit__entry_node in the source
ENABLED = os.environ.get("TRITONGEMM_NATIVE", "1") != "0"
#: the compiler may take this long (first build on a slow, busy machine) before it is abandoned
BUILD_TIMEOUT_S = 600

#: ``record(out, x, w, bias, entry)`` once the module is loaded, else None (``fastpath`` reads it per call).
RECORD = None
#: ``cast(dtype, x, w, bias)`` (the operands as autocast casts them) once loaded, else None.
CAST = None
#: ``signature(kind, x, w, bias, precision)`` (a call's packed key) once loaded, else None.
SIGNATURE = None

_state_lock = threading.Lock()
_thread: threading.Thread | None = None


class NativeBuildError(RuntimeError):
    """The C++ node could not be compiled or loaded (the message has the compiler's output)."""


class EarlierBuildFailed(NativeBuildError):
    """A build of this source for this torch failed before (its ``failed`` marker); not retried."""


def build_dir() -> Path:
    """The folder of this source's binary for this torch and Python (see the module docstring)."""
    env = os.environ
    if env.get("TRITONGEMM_NATIVE_DIR"):
        root = Path(env["TRITONGEMM_NATIVE_DIR"]).expanduser()
    elif env.get("TRITONGEMM_CACHE_DIR"):
        root = Path(env["TRITONGEMM_CACHE_DIR"]).expanduser() / "native"
    else:
        root = Path(platformdirs.user_cache_dir("tritongemm", appauthor=False)) / "native"
    return root / _build_key()


def _build_key() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (torch.__version__, str(_torch_root()), sys.implementation.cache_tag, sys.platform):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


def _torch_root() -> Path:
    return Path(torch.__file__).resolve().parent


def _binary(folder: Path) -> Path:
    return folder / (MODULE_NAME + (importlib.machinery.EXTENSION_SUFFIXES[0]))


def compile_command(output: Path) -> list[str]:
    """The compiler's command line: the source against this torch's headers and libraries."""
    root = _torch_root()
    include, lib = root / "include", root / "lib"
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return [
        cxx,
        str(SOURCE),
        "-o",
        str(output),
        "-shared",
        "-fPIC",
        "-O2",
        "-std=c++20",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}",
        f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
        f"-I{sysconfig.get_paths()['include']}",
        f"-L{lib}",
        "-lc10",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_python",
        f"-Wl,-rpath,{lib}",
    ]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(force: bool = False):
    """Build (or find) and load the module now; set ``RECORD``.  Returns the binary's path.

    Raises ``NativeBuildError`` with the compiler's output where it cannot be built or loaded.
    """
    global RECORD, CAST, SIGNATURE
    folder = build_dir()
    binary, failed, log = _binary(folder), folder / "failed", folder / "build.log"
    folder.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(folder / "build.lock")):
        if force:
            failed.unlink(missing_ok=True)
            binary.unlink(missing_ok=True)
        if not binary.exists():
            if failed.exists():
                raise EarlierBuildFailed(f"an earlier build failed (see {log}); build(force=True) retries")
            _compile(binary, failed, log)
    try:
        module = _load(binary)
    except ImportError as error:  # e.g. a binary of another torch at the same path
        raise NativeBuildError(f"{binary} does not load: {error}; build(force=True) rebuilds it") from error
    CAST = module.cast
    SIGNATURE = module.signature
    RECORD = module.record
    return binary


def _compile(binary: Path, failed: Path, log: Path) -> None:
    temporary = binary.with_name(f"{binary.name}.tmp-{os.getpid()}")
    command = compile_command(temporary)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        output, ok = done.stdout + done.stderr, done.returncode == 0
    except (OSError, subprocess.TimeoutExpired) as error:
        output, ok = f"{type(error).__name__}: {error}", False
    log.write_text(" ".join(command) + "\n\n" + output)
    if not ok:
        temporary.unlink(missing_ok=True)
        failed.write_text(output[-4000:])
        raise NativeBuildError(f"compiling {SOURCE.name} failed (log: {log}):\n{output[-2000:]}")
    os.replace(temporary, binary)


def start() -> None:
    """Load the module if it is built; else build it in a background thread (once per process)."""
    global _thread
    if _thread is not None or RECORD is not None or not ENABLED:
        return
    with _state_lock:
        if _thread is not None:
            return
        _thread = threading.Thread(target=_build_quietly, name="tritongemm-native-build", daemon=True)
        _thread.start()


def _build_quietly() -> None:
    try:
        build()
    except EarlierBuildFailed:
        pass  # warned about by the process whose build failed
    except NativeBuildError as error:
        warnings.warn(
            f"tritongemm: the C++ fast-path module was not built, repeated calls use its Python "
            f"equivalents (a few microseconds more each): {str(error).splitlines()[0]}",
            RuntimeWarning,
            stacklevel=1,
        )
    except Exception as error:  # never let a background build take the process down
        warnings.warn(f"tritongemm: building the C++ autograd node: {error!r}", RuntimeWarning, stacklevel=1)


def node_in_use() -> str:
    """Build (or load) the node now and say which autograd node repeated calls with grad run:
    for benchmarks to record, and to time the steady state rather than race a background build."""
    if not ENABLED:
        return "Python Function (TRITONGEMM_NATIVE=0)"
    try:
        return f"C++ ({build()})"
    except NativeBuildError as error:
        return f"Python Function (C++ node not built: {str(error).splitlines()[0]})"


def wait(timeout: float | None = None) -> bool:
    """Wait for a build ``start()`` began; True when the module is loaded."""
    thread = _thread
    if thread is not None:
        thread.join(timeout)
    return RECORD is not None


__all__ = [
    "ENABLED",
    "EarlierBuildFailed",
    "NativeBuildError",
    "build",
    "build_dir",
    "compile_command",
    "node_in_use",
    "start",
    "wait",
]
