"""tritongemm's benchmarks: ``python -m benchmarks quick | run | plot | list``.

* ``harness.py`` — fair timing (same process, same inputs, L2 rotation,
  do_bench medians), the correctness gate, ceilings, environment capture, CSV.
* ``suites.py``  — the shape lists and the implementations each suite compares,
  and ``run_suite(name, dtypes, out)`` for GPU scripts.
* ``quick.py``   — the main job (``run_quick()``): a short GPU benchmark, or a
  correctness demo on Triton's CPU interpreter when there is no GPU.
* ``plots.py``   — every figure, from CSVs alone (no GPU needed).
* ``schema.py``  — the one CSV schema every suite writes (columns and units).
* ``models.py``  — real models (transformers/timm, random weights): stock vs
  ``nn.convert`` / ``patch()`` / ``torch.compile``, gated, with a per-GEMM
  breakdown (``gemm_breakdown.py``); ``tiny_models.py`` holds the CPU test models.
* ``host.py``    — per-call host time of tiny GEMMs against torch.
* ``mlp.py``     — a whole MLP block, gated (SwiGLU, GeGLU: Llama-3-8B / Qwen2.5-7B / Gemma-7B widths) and
  plain (GPT-2 / BERT-large / ViT-H widths): stock torch against ``convert``'s fused and unfused blocks.
* ``epilogue.py`` — a linear layer's fused epilogue (bias + GELU, SiLU, tanh-GELU or residual)
  through ``tritongemm.linear`` against torch's unfused sequence, forward and forward + backward.
* ``fp8.py``     — ``tritongemm.scaled_mm`` against ``torch._scaled_mm`` (fp8 e4m3 in, bf16
  out; tensorwise and rowwise scales, fast accumulation off and on, and 1x128 x 128x128 block
  scales): ``python -m benchmarks fp8``; ``sweep_fp8_blockwise.py`` times every block-scaled recipe.
* ``runner.py``  — what ``mlp``, ``epilogue`` and ``fp8`` share: the gate's row, the progress loop,
  the table against torch, and the command line from the GPU check to the exit status.

Results live in ``benchmarks/results/<gpu>/`` (``h100/`` on any H100) as CSV + PNG.

Nothing is imported here eagerly: ``python -m benchmarks quick`` must decide
whether to re-run itself with ``TRITON_INTERPRET=1`` before tritongemm's
kernels are created.
"""

__all__ = ["harness", "plots", "quick", "suites"]
