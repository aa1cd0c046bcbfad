"""A call made valid before anything runs: torch's argument checks and error types (``checks``),
the same-batch views every function reduces to (``batched``), and whether a call runs here or
is handed to torch (``fallback``)."""
