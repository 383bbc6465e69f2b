"""The Slurm jobs a run submitted, written down as it submits them, so that the next run finds them.

A run killed where it cannot clean up (SIGKILL, a machine that went away) leaves its jobs running, and
their results would be thrown away while a resume submitted the same cases again. So each submission
appends one line per job to ``OUT/.<suite>.slurm-jobs.jsonl`` (next to the CSV, guarded by its lock):
the job, the submitit folder, and the case and budget it measures (as JSON). The next run on that CSV
reads it: a job of a case it is about to run, with the same case and budget, still pending, running or
finished with a result, is adopted instead of submitted again
(:meth:`topk_bench.run.slurm.SlurmExecutor.submit`); every other job still active is cancelled when the
run ends. A run that ends (normally, or interrupted: it cancels its own jobs) removes the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from topk_bench import fileio


@dataclass(frozen=True)
class Entry:
    """One submitted job."""

    job_id: str
    name: str  # the job's name: this run's own (``topk-bench-<token>``), told apart from a job that
    # reuses the id after the controller's state was wiped
    folder: str  # submitit's folder pattern (``.../run-<token>/%j``)
    case: str  # Case.to_json()
    budget: str  # Budget.to_json()

    @property
    def key(self) -> tuple[str, str]:
        return self.case, self.budget


class Journal:
    """``OUT/.<suite>.slurm-jobs.jsonl``: read once when the run starts, appended as it submits."""

    def __init__(self, path: Path):
        self.path = path
        self.found: list[Entry] = self._read()

    def _read(self) -> list[Entry]:
        try:
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            return []
        entries = []
        for line in lines:
            try:
                entries.append(Entry(**json.loads(line)))
            except (ValueError, TypeError):  # a line cut by a crash: that job is not adopted, only cancelled if listed
                continue
        return entries

    def add(self, entries: Iterable[Entry]) -> None:
        data = "".join(json.dumps(asdict(e)) + "\n" for e in entries).encode()
        if not data:
            return
        if self.path.exists():
            fileio.append(self.path, data)
        else:
            fileio.write_atomic(self.path, data)

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
