"""The linear layers of common LLMs, as GEMM problems to tune.

A linear layer ``y = x @ W.T`` with ``W`` of shape (out_features, in_features)
is a GEMM with M = tokens, N = out_features, K = in_features.  Through
``tritongemm.linear`` / ``nn.Linear`` the weight arrives as the stride view
``W.mT``, so its layout is "NT" (A row-major, B transposed).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..planning.problem import GemmProblem

#: Token counts M tuned when none are given: decode (1, 16), small and large prefill.
DEFAULT_TOKENS = (1, 16, 128, 1024, 4096, 8192)

#: How nn.Linear presents its operands (x row-major, W.mT transposed).
LINEAR_LAYOUT = "NT"


@dataclass(frozen=True)
class LinearLayer:
    """One projection: ``n`` = out_features, ``k`` = in_features."""

    name: str
    n: int
    k: int


@dataclass(frozen=True)
class TransformerShape:
    """The sizes of a decoder block that fix its linear layers (from the model's config.json)."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int

    def linear_layers(self, split: bool = False) -> list[LinearLayer]:
        """The block's projections; fused QKV and gate/up unless ``split``.

        ``split=True`` gives the modules as Hugging Face transformers runs them
        (separate q/k/v and gate/up projections), deduplicated by shape.

        >>> PRESETS["llama3-8b"].linear_layers()[0]
        LinearLayer(name='qkv_proj', n=6144, k=4096)
        """
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        if not split:
            layers = [
                LinearLayer("qkv_proj", q + 2 * kv, self.hidden),
                LinearLayer("o_proj", self.hidden, q),
                LinearLayer("gate_up_proj", 2 * self.intermediate, self.hidden),
                LinearLayer("down_proj", self.hidden, self.intermediate),
            ]
        else:
            layers = [
                LinearLayer("q_proj", q, self.hidden),
                LinearLayer("k_proj/v_proj", kv, self.hidden),
                LinearLayer("o_proj", self.hidden, q),
                LinearLayer("gate_proj/up_proj", self.intermediate, self.hidden),
                LinearLayer("down_proj", self.hidden, self.intermediate),
            ]
        return _dedupe_shapes(layers)


def _dedupe_shapes(layers: list[LinearLayer]) -> list[LinearLayer]:
    seen, unique = set(), []
    for layer in layers:
        if (layer.n, layer.k) not in seen:
            seen.add((layer.n, layer.k))
            unique.append(layer)
    return unique


# Numbers from the models' config.json on the Hugging Face hub.
PRESETS: dict[str, TransformerShape] = {
    "llama3-8b": TransformerShape(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128),
    "llama3-70b": TransformerShape(hidden=8192, intermediate=28672, heads=64, kv_heads=8, head_dim=128),
    "llama3-405b": TransformerShape(hidden=16384, intermediate=53248, heads=128, kv_heads=8, head_dim=128),
}


def preset_problems(
    name: str,
    tokens=DEFAULT_TOKENS,
    dtypes=("float16",),
    layouts=(LINEAR_LAYOUT,),
    split: bool = False,
) -> list[GemmProblem]:
    """Every (layer, token count, dtype, layout) of preset ``name`` as a GemmProblem.

    >>> len(preset_problems("llama3-8b", tokens=(1, 4096)))
    8
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    layers = PRESETS[name].linear_layers(split=split)
    return [
        GemmProblem(m=m, n=layer.n, k=layer.k, dtype=dtype, layout=layout)
        for layer in layers
        for m in tokens
        for dtype in dtypes
        for layout in layouts
    ]


__all__ = ["DEFAULT_TOKENS", "LINEAR_LAYOUT", "LinearLayer", "PRESETS", "TransformerShape", "preset_problems"]
