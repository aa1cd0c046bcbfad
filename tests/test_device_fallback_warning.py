"""Without a GPU and without the interpreter, nn.Linear and patch() run torch: they say so, once each.

Run in a fresh interpreter without TRITON_INTERPRET, since Triton fixes the
choice when tritongemm's kernels are decorated (at import).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import copy, json, warnings
import pytest
import torch
import tritongemm

assert not tritongemm.interpreter_enabled()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
reference = copy.deepcopy(model)
tritongemm.nn.convert(model)
x = torch.randn(5, 6)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    same = [torch.equal(model(x), reference(x)) for _ in range(3)]
    gram = torch.mm(x, x.T)
    with tritongemm.patch() as stats:
        for _ in range(2):
            same.append(torch.equal(x @ x.T, gram))
    with tritongemm.patch():
        x @ x.T
        compiled = torch.compile(lambda a: a @ a.T, fullgraph=True, backend="eager")(x)  # tracing must not warn
    same.append(torch.equal(compiled, gram))
print(json.dumps(dict(
    warnings=[dict(category=w.category.__name__, message=str(w.message), file=w.filename) for w in caught],
    same=same,
    layer_fallbacks=[sum(m.fallbacks.values()) for m in (model[0], model[2])],
    patch_fallbacks=stats.total_fallbacks,
    patch_served=stats.total_served,
)))
"""


@pytest.mark.heavy
def test_cpu_without_interpreter_warns_once_per_entry_point():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(result["same"]), "the fallback must compute exactly what torch computes"
    assert (
        result["layer_fallbacks"] == [3, 3] and result["patch_fallbacks"] == 2 and result["patch_served"] == 0
    )
    caught = result["warnings"]
    assert [w["message"].split(" runs ")[0] for w in caught] == [
        "tritongemm.nn.Linear",
        "tritongemm.patch()",
    ], caught
    for w in caught:
        assert w["category"] == "UserWarning"
        assert "TRITON_INTERPRET=1" in w["message"]
        if not torch.cuda.is_available():
            assert "no CUDA GPU" in w["message"]
        assert w["file"] == "<string>", "the warning should point at the user's line, not into the library"
