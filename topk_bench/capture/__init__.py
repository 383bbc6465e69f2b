"""A profile captured in the child: every storage live at a case's peak, named by its op, its line of code and
what it is for, and, where the case is measured, one iteration's time by op; written as files the parent reads.

``capture`` (the case measured or predicted with its peak attributed), ``attribution`` (storages by op and
line), ``cuda_snapshot`` (the CUDA allocator's own history), ``simulated`` (a CUDA prediction's peak blocks),
``allocator`` (a compiled call's allocations, from the profiler), ``files`` (the profile on disk), ``rows``
(peak.csv), ``summary`` (the story of the peak), ``sources`` (user lines), ``timing`` (torch.profiler),
``timeline`` (live bytes over the iteration's ops, as data).
"""
