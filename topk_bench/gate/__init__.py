"""The CPU time gate (``topk-bench gate``, the end of ``.ci/run``): this checkout's time regressions against a base
revision, both measured here, in interleaved rounds, each case by its CPU time round by round.

The flow: :mod:`.worktree` (the base commit, checked out beside this one) > :mod:`.blocks` (a side's rounds, one
``topk-bench run`` each) > :mod:`.judge` (each case's verdict from its time in each round, pure) > :mod:`.gate` (looks
until every case is decided, the outcome printed and kept).
"""
