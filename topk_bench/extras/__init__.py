"""Optional columns computed in the child after a case's measurement: fidelity against vanilla, selection
quality, a workload's own columns.

``columns`` (which a case gets, and computing them), ``fidelity`` (pure error metrics), ``quality``
(selection quality against exact attention).
"""
