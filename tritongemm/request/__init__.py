"""A call made valid before anything runs: the repeated-call key and lookup at the door
(``fastpath``), the operands as ``torch.autocast`` hands them (``autocast``), each function's
checks and views (``calls``, with torch's argument checks and error types in ``checks``), the
same-batch core every function reduces to (``batched``), and whether a call runs here or is
handed to torch, with every reason (``fallback``)."""
