"""Backends of the methods' hot loops: native CPU kernels (C, compiled on first use) and Triton kernels."""
