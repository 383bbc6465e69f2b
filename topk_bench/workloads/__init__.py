"""Workloads: what a case runs (a layer or a model, and its inputs), one module each, in a registry plug-ins extend.

>>> from topk_bench import workloads
>>> workloads.lookup("mha").params
{'seq_len': 512, 'batch': 1, 'd_model': 768, 'heads': 12}

A plug-in module named in a suite's ``plugins`` registers its own with
:func:`register` (docs/plugins.md, "Adding a workload").
"""

# Importing a module registers its workload.
from topk_bench.workloads import decode, decoder, ff, mha, prefill, pretrained  # noqa: F401 -- registers them
from topk_bench.workloads.spec import (  # noqa: F401 -- the package's interface
    Fixed,
    Traffic,
    UnknownWorkload,
    Workload,
    WorkloadSpec,
    build,
    hidden_states,
    lookup,
    names,
    register,
    traffic,
)
