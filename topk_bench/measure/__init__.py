"""Measuring one case in this process: its workload built and run through the protocol's iterations.

``steps`` (a case's workload built, one iteration run: what measuring and predicting share),
``iterations`` (the protocol's sequence of warm-up and timed iterations), ``backends`` (the CPU and CUDA
measurements: peak memory, time, FLOPs), ``memory`` (the live-tensor-bytes tracker), ``ops`` (the op
counter), ``compiled`` (torch.compile of a case), ``placement`` (every op on the case's device),
``contention`` (what the machine did meanwhile), ``metadata`` (where it was measured).
"""
