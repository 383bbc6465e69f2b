"""``topk-bench doctor``: does this machine measure what the harness claims? One check per concern.

- :mod:`~topk_bench.doctor.agreement`: each implementation's output and gradients against an
  exact reference on the CPU in float64 (tight) and float32 (looser), every op on the device;
- :mod:`~topk_bench.doctor.peaks`: measured peak bytes against the prediction;
- :mod:`~topk_bench.doctor.oom`: allocation failures through the real child process become
  ``oom`` / ``over_budget``;
- :mod:`~topk_bench.doctor.cuda`: TF32 off while CUDA measures;
- :mod:`~topk_bench.doctor.timer`: the backend's timer measures work (positive, finite,
  repeatable, growing with the work).

:func:`~topk_bench.doctor.diagnose.diagnose` runs them for a device; each returns
:class:`~topk_bench.doctor.check.Check` rows. Tiny shapes throughout: seconds, not minutes.
"""
