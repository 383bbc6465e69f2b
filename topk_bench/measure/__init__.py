"""The child side: one case measured (or predicted) in this process, and every failure turned into a status.

``backends`` (cpu, cuda, predict: peak memory, time, FLOPs), ``memory`` (the
live-tensor-bytes tracker), ``extras`` (optional columns: fidelity against
vanilla, a workload's own), ``fidelity`` (pure error metrics), ``metadata``
(where it was measured), ``worker`` (the child process's entry point),
``template`` (the warm process that forks a worker per case).
"""
