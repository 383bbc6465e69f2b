"""The results CSV: its columns, one row per case, the file (append, read), and a pandas view of it.

Written only by :mod:`topk_bench.run` (the parent process); read by
:mod:`topk_bench.run` (resume) and :mod:`topk_bench.report`. The contract of
the file is docs/CONTRACTS.md, "Results CSV".
"""
