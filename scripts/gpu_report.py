"""Reports on results CSVs for scripts/gpu_acceptance.sh: standard library only (they run before, or without,
the project's dependencies).

    python scripts/gpu_report.py status FOLDER ALLOWED        one line per case; 1 when a status is not allowed
    python scripts/gpu_report.py gaps MEASURED PREDICTED      measured CUDA peaks against --predict --device cuda
    python scripts/gpu_report.py times FOLDER [DISPATCH_S]    median time per case, against the fastest dense, and
                                                              (given the host's cost of one op) ops x that cost
    python scripts/gpu_report.py profiles FOLDER              each profile's peak.csv against its peak; snapshots open
    python scripts/gpu_report.py upto LIMIT SRC DST [LEAST]   SRC with its [sweep] seq_len cut to [LEAST, LIMIT]

``gaps``: per case of MEASURED (a folder or CSV of a measured CUDA run), the allocated peak above the
baseline against PREDICTED's peak above its baseline, and the reserved peak against the predicted one
(both sides hold the cuBLAS workspaces: :func:`gap`); exit 1 when a case is off by more
than :data:`PEAK_TOLERANCE` or :data:`RESERVED_TOLERANCE` (the CUDA prediction's stated accuracy,
docs/CONTRACTS.md), or when nothing was compared.
"""

from __future__ import annotations

import csv
import glob
import os
import re
import statistics
import sys

MIB = 2**20
PEAK_TOLERANCE = 1 * MIB
RESERVED_TOLERANCE = 0.05
DENSE = ("vanilla", "sdpa")


def rows(path: str) -> list[dict[str, str]]:
    if not os.path.exists(path):  # a step that wrote nothing: no rows, which the reports count as a failure
        return []
    paths = sorted(glob.glob(os.path.join(path, "*.csv"))) if os.path.isdir(path) else [path]
    found: list[dict[str, str]] = []
    for name in paths:
        with open(name, newline="") as fh:
            found += list(csv.DictReader(fh))
    return found


def number(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.2f}M"


def name(row: dict[str, str]) -> str:
    size = next((f"{k}={row[k]}" for k in ("seq_len", "kv_len") if row.get(k)), "")
    return f"{row.get('workload', '')}/{row.get('label') or row.get('impl', '')} {size}".strip()


def status(folder: str, allowed: str) -> int:
    """One line per case; 1 when a status is not in ALLOWED (comma-separated) or there is no row."""
    allowed_set, bad, found = set(allowed.split(",")), 0, rows(folder)
    for r in found:
        t = number(r.get("time_median_s"))
        note = "" if r["status"] in allowed_set else "   <-- " + (r.get("error") or "")[:200]
        bad += r["status"] not in allowed_set
        print(
            f"  {name(r)[:48]:48} {r['status']:11} peak={mib(number(r.get('peak_bytes')))} "
            f"reserved={mib(number(r.get('reserved_bytes')))} t={t * 1e3 if t else float('nan'):.3f}ms "
            f"ops={r.get('ops_per_iter', '')} {r.get('timer', '')} {r.get('sdpa_backend', '')}{note}"
        )
    print(f"  {len(found)} rows, {bad} with a status outside {sorted(allowed_set)}")
    return 1 if bad or not found else 0


def gap(measured: dict[str, str], predicted: dict[str, str]) -> tuple[float, float | None] | None:
    """(bytes the measured peak above its baseline is off the predicted one, reserved ratio measured / predicted)
    of one case; None when either side has no numbers. Both peaks hold the cuBLAS workspaces the warm-up left
    (``measure_cuda`` reads the baseline after the build, ``--predict --device cuda`` models them: workspace_bytes
    on both rows), so they compare as they are."""
    m_peak, m_base = number(measured.get("peak_bytes")), number(measured.get("baseline_bytes"))
    p_peak, p_base = number(predicted.get("peak_bytes")), number(predicted.get("baseline_bytes"))
    if None in (m_peak, m_base, p_peak, p_base):
        return None
    off = (m_peak - m_base) - (p_peak - p_base)
    m_res, p_res = number(measured.get("reserved_bytes")), number(predicted.get("reserved_bytes"))
    ratio = m_res / p_res if m_res and p_res else None
    return off, ratio


# What a case is: its describing columns and its parameters (topk_bench.results.columns.is_parameter: neither a
# required, a context nor a result column). They pair a measured row with its prediction, whose case_id differs by
# the method. The columns module is standard library only, so this script still runs without the dependencies.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from topk_bench.results.columns import is_parameter  # noqa: E402

DESCRIBING = ("suite", "workload", "impl", "label", "mode")


def _key(row: dict[str, str]) -> tuple:
    return tuple(
        sorted(
            (k, v)
            for k, v in row.items()
            if (k in DESCRIBING or is_parameter(k)) and not k.startswith("minilm_") and v not in ("", None)
        )
    )


def gaps(measured_path: str, predicted_path: str) -> int:
    predicted = {_key(r): r for r in rows(predicted_path) if r.get("status") == "ok"}
    off_cases, compared = 0, 0
    for r in rows(measured_path):
        p = predicted.get(_key(r))
        result = gap(r, p) if p is not None and r.get("status") == "ok" else None
        if result is None:
            print(f"  {name(r)[:48]:48} {r.get('status', ''):8} (no prediction to compare)")
            continue
        compared += 1
        off, ratio = result
        bad = abs(off) > PEAK_TOLERANCE or (ratio is not None and abs(ratio - 1) > RESERVED_TOLERANCE)
        off_cases += bad
        print(
            f"  {name(r)[:48]:48} above baseline off {off / MIB:+9.3f} MiB   reserved measured/predicted "
            f"{'-' if ratio is None else f'{ratio:.3f}'}{'   <-- off' if bad else ''}"
        )
    print(
        f"  {compared} cases compared, {off_cases} off by more than {PEAK_TOLERANCE // MIB} MiB above the baseline "
        f"or {RESERVED_TOLERANCE:.0%} reserved"
    )
    return 1 if off_cases or not compared else 0


def times(folder: str, dispatch_s: str = "") -> int:
    """Median time per case, and its ratio to the fastest dense case of the same sizes (the targets' reference).
    With DISPATCH_S (the host's cost of launching one op, seconds): ops_per_iter x DISPATCH_S beside the
    time, and "host-bound" where the host needs at least 80% of an events-timed iteration to launch its ops."""
    found = [r for r in rows(folder) if r.get("status") == "ok" and number(r.get("time_median_s"))]
    per_op = number(dispatch_s)
    groups: dict[tuple, list[dict[str, str]]] = {}
    for r in found:
        groups.setdefault(
            (r.get("kv_len"), r.get("seq_len"), r.get("budget"), r.get("timer"), r.get("dtype")), []
        ).append(r)
    for group in groups.values():
        dense = [number(r["time_median_s"]) for r in group if r.get("impl") in DENSE and not r.get("compile_s")]
        reference = min(dense) if dense else None
        for r in group:
            t = number(r["time_median_s"])
            samples = [float(x) for x in (r.get("times_s") or "").split(";") if x]
            spread = statistics.quantiles(samples, n=4) if len(samples) > 1 else [t, t, t]
            ratio = f"{t / reference:.3f}x dense" if reference else ""
            ops = number(r.get("ops_per_iter"))
            host = ""
            if per_op and ops:  # a graph's replay launches nothing from the host: bound by the host only with events
                launch = ops * per_op
                bound = launch >= 0.8 * t and r.get("timer") != "cudagraph"
                host = f"  host {launch * 1e3:.3f} ms{' host-bound' if bound else ''}"
            print(
                f"  {name(r)[:48]:48} {r.get('dtype', ''):8} {r.get('timer', ''):9} median {t * 1e3:9.3f} ms  IQR "
                f"{(spread[2] - spread[0]) * 1e3:7.3f} ms  ops {r.get('ops_per_iter', ''):>5}  {ratio}{host}"
            )
    return 0 if found else 1


def profiles(folder: str, expected: str = "1") -> int:
    """Each profile under FOLDER (a directory holding profile.json): its peak.csv's bytes against the peak above the
    baseline it names, and its snapshot.pickle (CUDA) read back with its segments and allocator history; 1 when one
    does not add up or open, or when there are fewer than EXPECTED."""
    import json
    import pickle

    bad, seen = 0, 0
    for meta_path in sorted(glob.glob(os.path.join(folder, "**", "profile.json"), recursive=True)):
        seen += 1
        here = os.path.dirname(meta_path)
        with open(meta_path) as fh:
            meta = json.load(fh)
        with open(os.path.join(here, "peak.csv"), newline="") as fh:
            listed = sum(int(r["bytes"]) for r in csv.DictReader(fh))
        above = (meta.get("peak_bytes") or 0) - (meta.get("baseline_bytes") or 0)
        line = (
            f"  {meta.get('what', here)[:60]:60} {meta.get('device')}: peak.csv {listed / MIB:.3f} MiB, peak above "
            f"the baseline {above / MIB:.3f} MiB"
        )
        ok = listed == above
        snapshot = os.path.join(here, "snapshot.pickle")
        if os.path.exists(snapshot):
            try:
                with open(snapshot, "rb") as fh:
                    snap = pickle.load(fh)
                events = sum(len(t) for t in snap.get("device_traces", []))
                line += f"; snapshot: {len(snap['segments'])} segments, {events} history events"
            except Exception as exc:  # noqa: BLE001 - any failure to read it back is the finding
                ok = False
                line += f"; snapshot.pickle does not open: {type(exc).__name__}: {exc}"
        elif meta.get("device") == "cuda" and meta.get("method") == "measured":
            ok, line = False, line + "; no snapshot.pickle"
        bad += not ok
        print(line + ("" if ok else "   <-- off"))
    print(f"  {seen} profiles of {expected} expected, {bad} that do not add up or open")
    return 1 if bad or seen < max(1, int(expected)) else 0


def upto(limit: str, src: str, dst: str, least: str = "0") -> int:
    """A copy of SRC whose [sweep] seq_len keeps the values <= LIMIT (and >= LEAST)."""
    text = open(src).read()

    def keep(m: re.Match) -> str:
        values = [v.strip() for v in m.group(1).split(",") if v.strip() and int(least) <= int(v) <= int(limit)]
        return "seq_len = [" + ", ".join(values) + "]"

    new, n = re.subn(r"^seq_len = \[([^\]]*)\]", keep, text, count=1, flags=re.M)
    if n != 1:
        sys.exit(f"no 'seq_len = [...]' line in {src}")
    open(dst, "w").write(new)
    return 0


if __name__ == "__main__":
    sys.exit(
        {"status": status, "gaps": gaps, "times": times, "profiles": profiles, "upto": upto}[sys.argv[1]](*sys.argv[2:])
    )
