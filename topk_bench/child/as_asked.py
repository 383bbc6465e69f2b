"""Whether a measured case ran as it asked: the one rule that compares what the child measured with (the row's
``timer``, ``graph_replays``, ``ran_dtype``, ``compiled``, ``threads``, ``code_path`` columns, reported by the
backend that ran it) with what the case asked. A difference makes the row ``not_as_asked``, its ``error`` naming
each one: a row never says cudagraph over eager samples, or float16 over a float32 run.
"""

from __future__ import annotations

from typing import Any

from topk_bench.case import Case, Measurement
from topk_bench.results import columns as col
from topk_bench.status import Status
from topk_bench.types import Method, Timer


def differences(case: Case, result: Measurement) -> list[str]:
    """What of ``case`` its measured ``result`` did otherwise, one phrase each ("" of nothing asked or reported)."""
    if case.method is not Method.MEASURED:
        return []
    ran: dict[str, Any] = {**result.metadata, **result.extra}
    found = []
    timer = ran.get(col.TIMER)
    if case.timer is not None and timer is not None and timer != case.timer:
        why = " (this device captures no CUDA graph)" if case.timer is Timer.CUDAGRAPH else ""
        found.append(f"timer {case.timer} asked, {timer} ran{why}")
    dtype = ran.get(col.RAN_DTYPE)
    if dtype is not None and dtype != case.dtype:
        found.append(f"dtype {case.dtype} asked, {dtype} ran")
    if case.compile and ran.get(col.COMPILED) is False:
        found.append("compile asked, the attention ran eagerly (torch.compile made no graph of it)")
    threads = ran.get(col.THREADS)
    if case.threads is not None and threads is not None and threads != case.threads:
        found.append(f"{case.threads} threads asked, {threads} ran")
    code_path = ran.get(col.CODE_PATH)
    if case.code_path and code_path is not None and code_path != case.code_path:
        found.append(f"code_path {case.code_path} expected, {code_path or 'none'} ran")
    return found


def judged(case: Case, result: Measurement) -> Measurement:
    """``result``, ``not_as_asked`` when it was ok and ran otherwise than ``case`` asked."""
    found = differences(case, result) if result.status == Status.OK else []
    if found:
        result.status, result.error = Status.NOT_AS_ASKED, "not as asked: " + "; ".join(found)
    return result
