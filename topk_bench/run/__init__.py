"""The parent side: a suite planned into cases and budgets, scheduled on an executor, rows written as cases end.

``plan`` (settings, overrides, budgets, header), ``order`` (the skip-larger
rule), ``runner`` (lock, resume, scheduling, the CSV), ``executors`` (local
child processes), ``launcher`` (one supervised child per case), ``slurm``
(job arrays through submitit), ``progress`` (what a run shows).
"""
