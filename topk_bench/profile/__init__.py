"""``topk-bench profile``, the parent's side: the cases picked by their parameters (``select``), each run in a
child that captures its profile (:mod:`topk_bench.capture`), then the peak printed by line (``command``).
docs/CONTRACTS.md, "Profiles"."""
