"""The heuristic: a good config without tuning, from the shape class and the device.

Pure functions of ``(GemmProblem, DeviceInfo)``: no tensors, no torch.cuda,
so each rule is tested alone on device fakes (``device.KNOWN_DEVICES``) and
``explain()`` can say what an H100 would run from a machine without one.
Each knob is one small function; each constant names the sweep it came from
(``benchmarks/results/h100/sweeps/``; docs/heuristics.md gathers the evidence).

* ``tiles``: the CTA tile menu and the knobs every rule shares (stages, split-K, shared memory);
* ``few_rows``: one row of A (GEMV), prompt-time rows, skinny tiles;
* ``waves``: sm_90 rules by waves of tiles (Stream-K, the warp-specialized kernel's tiles and order);
* ``choice``: which rule a shape class meets first (``heuristic_choice``);
* ``fp8``, ``epilogue``: what ``plan`` applies for one-byte operands (their tiles, how their products
  are summed) and for a fused activation (the tile that hides it).

Imports flow down that list.
"""

from .choice import (  # noqa: F401  (re-exported: the rules are tested one by one)
    Choice,
    heuristic_choice,
    heuristic_config,
    interpreter_config,
)
from .few_rows import (  # noqa: F401  (re-exported: the rules are tested one by one)
    PROMPT_ROWS,
    SKINNY_MENU,
    GemvTile,
    SkinnyTile,
    choose_gemv_tile,
    choose_skinny_tile,
    is_gemv,
    is_skinny,
    prompt_config,
)
from .tiles import (  # noqa: F401  (re-exported: the rules are tested one by one)
    SMALL_MAX_K,
    SMALL_TILE,
    SMALL_WIDE_TILE,
    TILE_MENU,
    Tile,
    choose_cta_tile,
    choose_long_k_tile,
    choose_num_stages,
    choose_split_k,
    choose_split_k_inline,
    fit_shared_memory,
    is_long_k,
    pow2_at_least,
    small_problem_tile,
    split_k_config,
    tiles_of,
)
from .waves import (  # noqa: F401  (re-exported: the rules are tested one by one)
    NARROW_ROW_TILES,
    SHORT_ROW_GROUP_M,
    SHORT_ROW_TILES,
    SPLIT_TAIL_SPEED,
    SPLIT_WIDTH_MARGIN,
    SPLIT_WIDTH_TILES,
    STREAM_K_EFFICIENCY,
    STREAM_K_MAX_WAVES,
    STREAM_K_MIN_STEPS,
    STREAM_K_TILE,
    TMA_STREAM_K_128,
    TMA_STREAM_K_128_EFFICIENCY,
    TMA_STREAM_K_MAX_SLIVER,
    TMA_STREAM_K_MIN_IDLE,
    TMA_STREAM_K_TILE,
    WIDE_TILE_DEEP_WAVES,
    WIDE_TILE_FEW_WAVES,
    WIDE_TILE_MANY_WAVES,
    WIDE_TILE_SINGLE_WAVE,
    WS_DEEP_TILE,
    WS_MAX_K,
    WS_NARROW_TILE,
    narrow_row_order,
    prefers_stream_k,
    prefers_tma_stream_k,
    split_tail_tile,
    split_width_tile,
    stream_k_config,
    warp_specialized_fits,
    warp_specialized_tile,
    wide_tile_config,
)

__all__ = ["Choice", "heuristic_choice", "heuristic_config"]
