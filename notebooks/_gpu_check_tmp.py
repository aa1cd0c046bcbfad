# temporary: run the notebook's code cells as a script (no IPython on the GPU machine)
import json, sys, time, types, traceback
import matplotlib
matplotlib.use("Agg")
mod = types.ModuleType("IPython.display")
def display(x):
    print(x if not hasattr(x, "savefig") else f"[figure {type(x).__name__}]")
mod.display = display
ip = types.ModuleType("IPython"); ip.get_ipython = lambda: None; ip.version_info = (9, 0); sys.modules["IPython"] = ip; sys.modules["IPython.display"] = mod
nb = json.load(open("notebooks/pipeline_stages.ipynb"))
ns = {"__name__": "__main__"}
t0 = time.time()
for i, c in enumerate(nb["cells"]):
    if c["cell_type"] != "code":
        continue
    print(f"===== cell {i} ({time.time()-t0:.1f}s)", flush=True)
    exec(compile("".join(c["source"]), f"cell{i}", "exec"), ns)
print(f"done in {time.time()-t0:.1f}s")
