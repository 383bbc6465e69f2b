"""What CUDA's kernels allocate that the fake (CPU) run does not show: the rules a CUDA prediction applies.

- :mod:`.gpus`: the GPUs modelled (``--gpu sm80|sm90``);
- :mod:`.program`, :mod:`.registry`: a rule's allocation program, and the rules keyed by aten overload (with
  the op families that need none);
- :mod:`.rules`: the rules, one module per family of CUDA kernels, each naming the source it models;
- :mod:`.sdpa_select`, :mod:`.composites`: the composites that choose their kernels by device (SDPA's backend,
  dropout) take CUDA's branch in the fake run;
- :mod:`.accumulation`: the autograd engine's gradient accumulations, in place on CUDA;
- :mod:`.trace`: the allocation trace with the rules applied, for :mod:`topk_bench.predict.simulated`.
"""

from topk_bench.predict.kernels import rules  # noqa: F401 -- registers the rules
from topk_bench.predict.kernels.accumulation import EngineAdds
from topk_bench.predict.kernels.composites import CudaComposites
from topk_bench.predict.kernels.gpus import DEFAULT, GPUS, Gpu, gpu
from topk_bench.predict.kernels.trace import KernelTrace

__all__ = ["CudaComposites", "DEFAULT", "EngineAdds", "GPUS", "Gpu", "KernelTrace", "gpu"]
