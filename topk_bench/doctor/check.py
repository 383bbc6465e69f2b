"""One row of the doctor's report: what was checked, its result and why."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Result(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIPPED = "skipped"  # cannot be checked here (no CUDA, an op this torch lacks): not a failure

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Check:
    name: str
    result: Result
    detail: str

    @classmethod
    def judged(cls, name: str, passed: bool, detail: str) -> Check:
        return cls(name, Result.PASS if passed else Result.FAIL, detail)


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.result == Result.FAIL]


def compile_failure(problem: BaseException | str) -> str | None:
    """The reason when ``problem`` (an exception, or a failed case's one-line error) is torch.compile's backend
    refusing to compile (``BackendCompilerFailed``: e.g. FlexAttention on CUDA below head_dim 16): what this
    torch cannot compile is skipped, not failed; None for anything else."""
    if isinstance(problem, BaseException):
        seen: BaseException | None = problem
        while seen is not None and not any(c.__name__ == "BackendCompilerFailed" for c in type(seen).__mro__):
            seen = seen.__cause__ or seen.__context__  # raised while handling it, or from it
        if seen is None:
            return None
        problem = f"BackendCompilerFailed: {seen}"
    text = " ".join(problem.split())  # its message spans lines: "backend='inductor' raised:", then the reason
    return text[:240] if text.startswith("BackendCompilerFailed") else None


def brief(text: object, limit: int) -> str:
    """The first line of ``text``, at most ``limit`` characters, cut after a whole word and marked ``...`` when
    cut (a detail cut mid-word, "(forward only: ru)", reads as a different word)."""
    lines = str(text).strip().splitlines()
    line = lines[0] if lines else ""
    if len(line) <= limit:
        return line
    cut = line[: limit - 3]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" ,;:(") + "..."
