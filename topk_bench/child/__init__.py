"""The child process: one case per process, forked from a warm template, every failure turned into a status.

``worker`` (the entry point, ``python -m topk_bench.child.worker``), ``execute`` (a case measured or
predicted, then its extra columns; a failure classified), ``template`` (the warm process that forks a
worker per case), ``warmup`` (what the template runs before forking), ``leftovers`` (what a case left
running, killed).
"""
