"""Profiles (issue 27): every storage live at a case's peak, named by its op, its line of code and what it is for,
and, where the case is measured, one iteration's time by op. ``topk-bench profile``, ``run --profile``;
docs/CONTRACTS.md, "Profiles"."""
