"""The differentiable GEMM: the eager ``autograd.Function`` and its backward (``function``), the
``torch.library`` ops ``torch.compile`` and ``torch.export`` trace (``ops``), DTensor's sharding
rule (``distributed``), the repeated-call entries (``fastpath``), and the gated GEMM of GLU MLPs
with its two doors (``gated``)."""
