"""The peak's rows: one per storage live at the moment of the peak, what it is and where it comes from.

``peak.csv`` holds them, largest first: ``bytes, op, source, shape, dtype, category``. Their bytes sum to
the case's ``peak_bytes - baseline_bytes``: the storages that existed before the iteration (inputs,
parameters, kept tensors) are the baseline, not rows.
"""

from __future__ import annotations

import csv
import enum
import io
from collections.abc import Iterable
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from topk_bench import fileio


class Category(str, enum.Enum):
    """What a storage live at the peak is there for."""

    INPUTS = "inputs and parameters"  # built with the model (a build inside the measured region: the paper's loop)
    SAVED = "saved for backward"  # made in the forward and kept by autograd for the backward
    GRADIENTS = "gradients"  # made in the backward and handed on: a gradient flowing, or a .grad
    TEMPORARIES = "temporaries"  # freed by the op, or the backward step, that made it; or held by the harness
    WORKSPACE = "workspace"  # below the dispatcher: a library's or kernel's own buffer (cuBLAS)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Row:
    bytes: int
    op: str  # the aten overload that made it (``aten.bmm.default``); empty when unknown
    source: str  # ``topk_bench/attention/methods/vanilla.py:42``
    shape: str  # ``[1, 12, 512, 512]``
    dtype: str  # ``float32``
    category: Category


COLUMNS = tuple(f.name for f in fields(Row))


def shape_text(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def ordered(rows: Iterable[Row]) -> list[Row]:
    """Largest first; ties by source, then op, so that a file is the same from run to run."""
    return sorted(rows, key=lambda r: (-r.bytes, r.source, r.op, r.shape))


def to_csv(rows: Iterable[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in ordered(rows):
        writer.writerow([str(v) for v in astuple(row)])
    return out.getvalue()


def write(path: Path, rows: Iterable[Row]) -> None:
    fileio.write_atomic(path, to_csv(rows).encode())


def read(path: Path) -> list[Row]:
    with open(path, newline="") as handle:
        return [
            Row(
                bytes=int(r["bytes"]),
                op=r["op"],
                source=r["source"],
                shape=r["shape"],
                dtype=r["dtype"],
                category=Category(r["category"]),
            )
            for r in csv.DictReader(handle)
        ]
