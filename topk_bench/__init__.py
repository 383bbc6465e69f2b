"""topk-bench: a benchmarking and profiling harness for memory-efficient attention."""

__version__ = "0.1.0"
