"""Peak memory without running the compute: a case under FakeTensorMode, and for CUDA the model of its kernels
and of the caching allocator.

``backends`` (``predict`` for the CPU and CUDA), ``trace`` (every storage allocated and freed, in order),
``kernels`` (what CUDA's kernels allocate that the fake run does not show), ``allocator`` (PyTorch's CUDA
caching allocator, simulated), ``simulated`` (the protocol's iterations replayed on it).
"""
