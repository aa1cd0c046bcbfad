"""What runs, decided from values only (no tensors): the tiling hierarchy (``configs``,
``pipelines``, ``schedules``), the heuristics, the tuning cache as a source (``selection``),
which kernel takes which layouts (``eligibility``, ``unaligned``) and the ``plan``."""
