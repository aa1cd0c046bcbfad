"""notebooks/pipeline_stages.ipynb runs top to bottom: every cell, no errors.

The notebook is executed with nbclient in a fresh Jupyter kernel started from
this interpreter (``sys.executable``, i.e. the venv that runs pytest), with the
repository root as its working directory.  It sets ``TRITON_INTERPRET=1`` itself
when there is no GPU, runs the kernels at small sizes and checks each pipeline
variant against a float64 reference; its own asserts fail the test.

Set ``TRITONGEMM_EXECUTED_NOTEBOOK=path.ipynb`` to keep the executed copy
(outputs and figures included) for reading.
"""

import copy
import json
import os
import sys
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient", reason="needs nbclient (pip install -e '.[test]')")
nbformat = pytest.importorskip("nbformat", reason="needs nbformat (pip install -e '.[test]')")
pytest.importorskip("ipykernel", reason="needs ipykernel (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "pipeline_stages.ipynb"
#: Seconds any one cell may take (the whole notebook takes about 10 s on the interpreter).
CELL_TIMEOUT_S = 180
KERNEL_NAME = "python3"

# Appended to the in-memory copy only: which interpreter and tritongemm the kernel ran.
_PROBE = "import json, sys, tritongemm; print(json.dumps([sys.executable, tritongemm.__file__]))"


def _kernelspec_dir(base: Path) -> Path:
    """A Jupyter data dir whose ``python3`` kernel is this interpreter (not whatever
    ``python3`` a user-level or system kernelspec names)."""
    spec = base / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": f"Python 3 ({sys.executable})",
                "language": "python",
            }
        )
    )
    return base


@pytest.mark.heavy
def test_pipeline_stages_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(_kernelspec_dir(tmp_path / "jupyter")))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(_PROBE))
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL_NAME,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=120,
        resources={"metadata": {"path": str(ROOT)}},  # the kernel's working directory
    )
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback, on the first error
    finally:
        keep = os.environ.get("TRITONGEMM_EXECUTED_NOTEBOOK")
        if keep:
            executed = copy.deepcopy(nb)
            executed.cells.pop()  # the probe
            nbformat.write(executed, keep)

    probe = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    executable, module = json.loads(probe)
    assert Path(executable) == Path(sys.executable), (
        f"kernel ran {executable}, not this interpreter {sys.executable}"
    )
    assert Path(module).resolve().is_relative_to(ROOT), (
        f"kernel imported tritongemm from {module}, not {ROOT}"
    )
    errors = [
        o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"
    ]
    assert not errors, errors
    # a reader's notebook, not a dump: its executed outputs (figures included) stay small
    output_bytes = len(json.dumps([cell.outputs for cell in nb.cells if cell.cell_type == "code"]))
    assert output_bytes < 1_500_000, f"{output_bytes / 1e6:.1f} MB of outputs"


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
