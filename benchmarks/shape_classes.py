"""Shape classes beyond the Llama-3 suites: other decoder families, and short K over many tiles.

* ``families``: the linear layers of four public decoder families other than
  Llama-3 (dimensions from each model's ``config.json``), at M (tokens) in
  {256, 512, 1024, 2048, 6000}: the prefill sizes where one large tile per
  SM leaves waves partly empty.
* ``shortk``: many tiles with a short K: encoder widths 768-1280 at M >= 8k
  (BERT-base/-large, ViT-B/-H blocks; ViT-B at batch 64 is 64 x 197 = 12608
  tokens), and K = 128-256 with a large M x N.

``python -m benchmarks run --suite families,shortk`` measures them against
cuBLAS like every suite (``square`` covers the squares 1024-8192, in between included).
"""

from __future__ import annotations

from dataclasses import dataclass

from .harness import Case


@dataclass(frozen=True)
class LlamaDims:
    """A Llama-style decoder block: fused QKV, grouped KV heads, fused gate/up MLP."""

    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int = 128

    @property
    def qkv(self) -> int:
        """Fused Q, K, V output width: all query heads plus the (grouped) key and value heads."""
        return self.n_heads * self.head_dim + 2 * self.n_kv_heads * self.head_dim

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, N, K) of each linear layer of a decoder block: y[M, N] = x[M, K] @ W[N, K].T"""
        return [
            ("qkv", self.qkv, self.hidden),
            ("o", self.hidden, self.n_heads * self.head_dim),  # = hidden unless head_dim says otherwise
            ("gate_up", 2 * self.intermediate, self.hidden),  # gate and up fused into one GEMM
            ("down", self.hidden, self.intermediate),
        ]


#: Four decoder families other than Llama-3 (hidden_size, intermediate_size, num_attention_heads,
#: num_key_value_heads, head_dim of each model's config.json).
FAMILIES: dict[str, LlamaDims] = {
    "qwen2.5-7b": LlamaDims(hidden=3584, intermediate=18944, n_heads=28, n_kv_heads=4),
    "phi-3-mini": LlamaDims(hidden=3072, intermediate=8192, n_heads=32, n_kv_heads=32, head_dim=96),
    "gemma-2-9b": LlamaDims(hidden=3584, intermediate=14336, n_heads=16, n_kv_heads=8, head_dim=256),
    "mistral-nemo-12b": LlamaDims(hidden=5120, intermediate=14336, n_heads=32, n_kv_heads=8),
}
FAMILY_TOKENS = (256, 512, 1024, 2048, 6000)

#: Encoder blocks: (name, width, MLP width); QKV fused (3 x width), attention output, MLP up and down.
ENCODERS = (("bert-base", 768, 3072), ("bert-large", 1024, 4096), ("vit-h", 1280, 5120))
ENCODER_TOKENS = (8192, 12608)
#: K = 128-256 with many output tiles (low-rank adapters' up-projections, narrow heads).
SHORT_K = ((8192, 8192, 128), (8192, 8192, 256), (16384, 4096, 128), (16384, 4096, 256))


def family_cases() -> list[Case]:
    cases = []
    for model, dims in FAMILIES.items():
        for proj, n, k in dims.projections():
            for m in FAMILY_TOKENS:
                label = f"{model} {proj} M={m} N={n} K={k}"
                cases.append(Case("families", f"{model} {proj}", label, m, n, k, "NT", m, "M (tokens)"))
    return cases


def shortk_cases() -> list[Case]:
    cases = []
    for name, width, mlp in ENCODERS:
        for m in ENCODER_TOKENS:
            for proj, n, k in (
                ("qkv", 3 * width, width),
                ("o", width, width),
                ("up", mlp, width),
                ("down", width, mlp),
            ):
                label = f"{name} {proj} M={m} N={n} K={k}"
                cases.append(Case("shortk", f"encoder K={k}", label, m, n, k, "NT", m, "M (tokens)"))
    for m, n, k in SHORT_K:
        cases.append(Case("shortk", f"K={k}", f"{m}x{n}x{k}", m, n, k, "NN", m, "M"))
    return cases


__all__ = ["ENCODERS", "FAMILIES", "FAMILY_TOKENS", "LlamaDims", "SHORT_K", "family_cases", "shortk_cases"]
