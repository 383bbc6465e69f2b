#!/usr/bin/env bash
# GPU acceptance check for topk-bench: does the harness work on a real NVIDIA GPU?
# (The team's acceptance script, kept here with the package's module paths and a `doctor` step.)
#
# Run from the root of a copy of the project, on a machine with a CUDA GPU and a CUDA build of torch:
#     bash gpu_check.sh
# It writes two files under $OUT: summary.txt (PASS/FAIL/WARN lines) and gpu_check.tar.gz
# (every log, the CSVs, compare.md, benchmark.json). Both are rewritten after each step, so a run
# cut off by a time limit still leaves what it had done.
#
# Knobs (environment):
#   OUT          output folder (default ./gpu_check_out)
#   PYTHON       interpreter holding torch (default python3)
#   WHEELHOUSE   folder of carried wheels used for missing dependencies (default ./.wheels, else ./wheels)
#   BUDGET_S     wall-clock budget of the whole script, seconds (default 570: fits a 600 s call)
#   STEPS        subset, in this order: env install probe doctor tests smoke ci mha (default: all)
#   MHA_MAX_SEQ  largest seq_len of the mha step (default 16384); MHA_MAX_GIB its --max-memory (default 60)
#   ALLOW_CPU=1  dry run without CUDA (device cpu): tests this script itself, proves nothing about GPUs
# Exit status: 0 all checks passed, 1 some check failed, 2 no usable torch with CUDA.
set -uo pipefail

ROOT=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/gpu_check_out}
BUDGET_S=${BUDGET_S:-570}
STEPS=${STEPS:-env install probe doctor tests smoke ci mha}
MHA_MAX_SEQ=${MHA_MAX_SEQ:-16384}
MHA_MAX_GIB=${MHA_MAX_GIB:-60}
WHEELHOUSE=${WHEELHOUSE:-}
if [ -z "$WHEELHOUSE" ]; then
    for d in "$ROOT/.wheels" "$ROOT/wheels"; do [ -d "$d" ] && WHEELHOUSE=$d && break; done
fi
START=$(date +%s)
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
FAILS=0
DEV=cuda
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

say()  { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
pass() { say "PASS  $*"; }
fail() { say "FAIL  $*"; FAILS=$((FAILS + 1)); }
warn() { say "WARN  $*"; }
snap() {  # everything so far into $OUT/gpu_check.tar.gz (written beside, then moved in)
    cp "$SUMMARY" "$WORK/summary.txt" 2>/dev/null
    tar czf "$WORK.tgz" -C "$WORK" . 2>/dev/null && mv -f "$WORK.tgz" "$OUT/gpu_check.tar.gz"
}
trap 'say "interrupted"; snap; exit 143' TERM INT
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
left() { echo $((START + BUDGET_S - $(date +%s))); }
cap()  { local l=$(($(left) - 15)); if [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi; }
# logged NAME SECONDS CMD...: run CMD with a time limit, output in $WORK/NAME.log; returns CMD's status
logged() {
    local name=$1 secs=$2 rc
    shift 2
    if [ "$secs" -lt 20 ]; then
        warn "$name: not run, the time budget (BUDGET_S=$BUDGET_S) is spent"
        return 125
    fi
    say "----- $name (limit ${secs}s, $(($(date +%s) - START))s elapsed): $*"
    timeout -k 15 -s TERM "$secs" "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    [ "$rc" -eq 124 ] && warn "$name: stopped at its ${secs}s limit (finished rows are kept)"
    tail -n 4 "$WORK/$name.log" | sed 's/^/      | /' >>"$SUMMARY"
    return "$rc"
}

# Helpers on the results, standard library only (they work without pandas).
cat >"$WORK/report.py" <<'EOF'
import csv, glob, json, math, os, sys

def rows(folder):
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "*.csv"))):
        with open(path, newline="") as fh:
            out += list(csv.DictReader(fh))
    return out

def mib(v):
    return f"{float(v) / 2**20:.1f}M" if v not in (None, "") else "-"

def status(folder, allowed):
    """One line per case; non-zero exit when a status is not in ALLOWED."""
    allowed, bad, found = set(allowed.split(",")), 0, rows(folder)
    for r in found:
        t = r.get("time_median_s")
        note = "" if r["status"] in allowed else "   <-- " + (r.get("error") or "")[:200]
        bad += r["status"] not in allowed
        print(f"  {r['workload']:7} {r['label'][:32]:32} L={r.get('seq_len', ''):6} {r['status']:11} "
              f"peak={mib(r.get('peak_bytes'))} reserved={mib(r.get('reserved_bytes'))} "
              f"baseline={mib(r.get('baseline_bytes'))} t={float(t) * 1e3 if t else float('nan'):.2f}ms{note}")
    print(f"  {len(found)} rows, {bad} with a status outside {sorted(allowed)}")
    return 1 if bad or not found else 0

def diff(a, b):
    """Two runs of one suite: memory must repeat exactly; prints time ratios."""
    base = {r["case_id"]: r for r in rows(a)}
    worst, n = 0.0, 0
    for r in rows(b):
        o = base.get(r["case_id"])
        if not o or r["status"] != "ok" or o["status"] != "ok":
            continue
        n += 1
        ratios = []
        for col in ("peak_bytes", "reserved_bytes", "time_median_s"):
            x, y = o.get(col), r.get(col)
            ratios.append(float(y) / float(x) if x and y and float(x) else float("nan"))
        worst = max(worst, abs(ratios[0] - 1) if not math.isnan(ratios[0]) else 0)
        print(f"  {r['workload']:7} {r['label'][:32]:32} peak x{ratios[0]:.4f} reserved x{ratios[1]:.4f} time x{ratios[2]:.3f}")
    print(f"  {n} ok cases in both runs; largest peak_bytes change {worst:.2e}")
    return 2 if worst > 0.001 or n == 0 else (1 if worst > 0 else 0)

def bench_json(path):
    """github-action-benchmark customSmallerIsBetter: a list of {name, unit, value, range?, extra?}."""
    data, problems, names = json.load(open(path)), [], set()
    if not isinstance(data, list) or not data:
        problems.append("not a non-empty JSON list")
    for e in data if isinstance(data, list) else []:
        if not isinstance(e, dict) or not set(e) <= {"name", "unit", "value", "range", "extra"}:
            problems.append(f"unexpected entry or keys: {e!r}"[:200]); continue
        if not isinstance(e.get("name"), str) or not isinstance(e.get("unit"), str):
            problems.append(f"name/unit not strings: {e!r}"[:200])
        v = e.get("value")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            problems.append(f"value not a finite number: {e!r}"[:200])
        if any(k in e and not isinstance(e[k], str) for k in ("range", "extra")):
            problems.append(f"range/extra not strings: {e!r}"[:200])
        if e.get("name") in names:
            problems.append(f"duplicate name {e.get('name')!r}")
        names.add(e.get("name"))
    units = sorted({e.get("unit") for e in data if isinstance(e, dict)}) if isinstance(data, list) else []
    print(f"  {len(data) if isinstance(data, list) else 0} entries, units {units}; {len(problems)} problem(s)")
    for p in problems[:10]:
        print("   ", p)
    return 1 if problems else 0

def suite_upto(limit, src, dst):
    """A copy of SRC whose [sweep] seq_len keeps the values <= LIMIT."""
    import re
    text = open(src).read()
    keep = lambda m: "seq_len = [" + ", ".join(v.strip() for v in m.group(1).split(",") if v.strip() and int(v) <= int(limit)) + "]"
    new, n = re.subn(r"^seq_len = \[([^\]]*)\]", keep, text, count=1, flags=re.M)
    if n != 1:
        sys.exit(f"no 'seq_len = [...]' line in {src}")
    open(dst, "w").write(new)
    return 0

if __name__ == "__main__":
    sys.exit({"status": status, "diff": diff, "json": bench_json, "upto": suite_upto}[sys.argv[1]](*sys.argv[2:]))
EOF
report() { "$PY" "$WORK/report.py" "$@" 2>&1 | tee -a "$SUMMARY"; return "${PIPESTATUS[0]}"; }

say "gpu_check: $(date -u +%FT%TZ) root=$ROOT python=$PY steps='$STEPS' budget=${BUDGET_S}s"

# ---------------------------------------------------------------- env: torch with CUDA?
if ! "$PY" -c 'import torch' >/dev/null 2>&1 && [ -n "$WHEELHOUSE" ]; then
    say "torch does not import: trying the wheelhouse $WHEELHOUSE"
    timeout 300 "$PY" -m pip install --no-index --find-links "$WHEELHOUSE" torch >"$WORK/torch_install.log" 2>&1
fi
if ! "$PY" -c 'import torch; print(torch.cuda.is_available())' >"$WORK/env.out" 2>"$WORK/env.err"; then
    say "FATAL: '$PY' cannot import torch ($(tail -n 1 "$WORK/env.err")). Bring a CUDA build of torch"
    say "       (carry wheels and set WHEELHOUSE, or set PYTHON to an interpreter that has one)."
    snap
    exit 2
fi
if [ "$(tail -n 1 "$WORK/env.out")" != "True" ]; then
    if [ "${ALLOW_CPU:-0}" = 1 ]; then
        DEV=cpu
        warn "torch.cuda.is_available() is False: DRY RUN on the CPU (ALLOW_CPU=1); nothing here is about GPUs"
    else
        say "FATAL: torch imports but torch.cuda.is_available() is False (a CPU-only build, or no driver/GPU)."
        "$PY" -c 'import torch; print("torch", torch.__version__, "built with CUDA", torch.version.cuda)' 2>&1 | tee -a "$SUMMARY"
        command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | tee -a "$SUMMARY"
        snap
        exit 2
    fi
fi
export DEV
if want env; then
    { command -v nvidia-smi >/dev/null && nvidia-smi; } >"$WORK/nvidia-smi.log" 2>&1
    "$PY" - <<'EOF' 2>&1 | tee -a "$SUMMARY"
import os, platform, torch
print(f"python {platform.python_version()}  torch {torch.__version__}  CUDA {torch.version.cuda}  "
      f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    print(f"GPU 0 of {torch.cuda.device_count()}: {p.name}, sm_{p.major}{p.minor}, {total / 2**30:.1f} GiB "
          f"({free / 2**30:.1f} free), {p.multi_processor_count} SMs")
EOF
    snap
fi

# ---------------------------------------------------------------- install
TB=("$PY" -m topk_bench)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the launcher's children get it too (launcher.py)
missing_deps() {  # [runtime]: only what `topk-bench run` imports
    "$PY" - "$@" <<'EOF'
import importlib.util, sys
mods = {"torch": "torch", "performer_pytorch": "performer-pytorch", "local_attention": "local-attention",
        "axial_positional_embedding": "axial-positional-embedding", "einops": "einops", "pandas": "pandas",
        "matplotlib": "matplotlib", "typer": "typer", "rich": "rich", "pydantic": "pydantic", "scipy": "scipy",
        "filelock": "filelock", "pytest": "pytest", "setuptools": "setuptools"}
if sys.version_info < (3, 11):
    mods["tomli"] = "tomli"
if sys.argv[1:] == ["runtime"]:
    for test_or_build in ("pytest", "setuptools"):
        del mods[test_or_build]
print(" ".join(pkg for mod, pkg in mods.items() if importlib.util.find_spec(mod) is None))
EOF
}
if want install; then
    say "----- install"
    MISSING=$(missing_deps)
    if [ -n "$MISSING" ] && [ -n "$WHEELHOUSE" ]; then
        say "missing before: $MISSING; trying the wheelhouse $WHEELHOUSE"
        for pkg in $MISSING; do
            timeout 120 "$PY" -m pip install --no-index --find-links "$WHEELHOUSE" "$pkg" >>"$WORK/install.log" 2>&1 \
                || say "      not in the wheelhouse (or its dependencies are not): $pkg"
        done
        MISSING=$(missing_deps)
    fi
    NODEPS=()
    if [ -n "$MISSING" ]; then
        warn "missing Python packages: $MISSING  (carry their wheels, with their dependencies, in WHEELHOUSE)"
    fi
    [ -n "$(missing_deps runtime)" ] && NODEPS=(--no-deps)
    pipi() { timeout 240 "$PY" -m pip install --retries 0 --timeout 15 ${NODEPS[@]+"${NODEPS[@]}"} "$@" >>"$WORK/install.log" 2>&1; }
    if pipi --no-build-isolation -e . || pipi -e . \
        || { grep -q externally-managed "$WORK/install.log" && pipi --no-build-isolation --break-system-packages -e .; }; then
        pass "pip install ${NODEPS[*]:+${NODEPS[*]} }-e ."
    else
        warn "pip install -e . failed (install.log); running from the checkout through PYTHONPATH"
    fi
    if ! "$PY" -c 'import performer_pytorch.performer_pytorch' >>"$WORK/install.log" 2>&1; then
        fail "performer-pytorch does not import ($(tail -n 1 "$WORK/install.log")); every performer case will be 'error'"
    fi
    snap
fi
BIN=$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))')
[ -x "$BIN/topk-bench" ] && TB=("$BIN/topk-bench")
CLI_OK=1
if ! { "${TB[@]}" --help && "$PY" -c 'import topk_bench.run.runner, topk_bench.report.compare, pydantic, typer'; } \
    >"$WORK/cli_check.log" 2>&1; then
    CLI_OK=0
    fail "the CLI cannot run ($(tail -n 1 "$WORK/cli_check.log")); smoke, ci and mha steps skipped"
fi

# ---------------------------------------------------------------- probe: every implementation on the device
if want probe; then
    logged probe "$(cap 150)" "$PY" - <<'EOF'
import copy, dataclasses, os, warnings
import torch
from topk_bench import workloads
from topk_bench.measure import backends as measure, worker
from topk_bench.case import Budget, Case

dev = os.environ["DEV"]
fails = 0
IMPLS = [("vanilla", {}), ("sdpa", {}), ("qchunk", {"chunk_size": 16}), ("topk", {"topk": 8, "chunk_size": 16}),
         ("topk_fast", {"topk": 8, "chunk_size": 16}), ("topk_sparse", {"topk": 8, "chunk_size": 16}),
         ("performer", {"nb_features": 16, "chunk_size": 16})]

def case(impl, opts, causal, **kw):
    return Case.make(suite="probe", workload="mha", impl=impl, params={"seq_len": 64, "d_model": 64, "heads": 4, "batch": 2},
                     options=opts, causal=causal, device=dev, **kw)

def first(e):
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"

torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
print("1) built on the device (as measure_cuda does: workloads.build under torch.device) and run fwd+bwd;")
print("2) built on the CPU, copied to the device: output and input gradient against the CPU's (TF32 off)")
for impl, opts in IMPLS:
    for causal in (True, False):
        c = case(impl, opts, causal)
        try:
            wl = workloads.build(c, dev, torch.float32)
            wl().mean().backward()
            built = "ok"
        except Exception as e:
            built, fails = "FAILED " + first(e), fails + 1
        try:
            ref = workloads.build(c, "cpu", torch.float32)
            model = copy.deepcopy(ref.model).to(dev)
            x = ref.inputs[0]
            xd = x.detach().to(dev).requires_grad_(True)
            g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
            o = ref.model(x); o.backward(g)
            od = model(xd); od.backward(g.to(dev))
            eo = ((od.detach().cpu() - o.detach()).norm() / o.detach().norm()).item()
            eg = ((xd.grad.cpu() - x.grad).norm() / x.grad.norm()).item()
            agree = f"rel err out {eo:.1e} grad {eg:.1e}" + ("" if max(eo, eg) < 1e-3 else "  <-- MISMATCH")
            fails += max(eo, eg) >= 1e-3
        except Exception as e:
            agree, fails = "FAILED " + first(e), fails + 1
        print(f"  {impl:12} causal={causal!s:5} 1) {built}   2) {agree}")

print("3) measure.measure in this process (one child per case is the CLI's way; numbers here are indicative)")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for impl, opts in IMPLS:
        c = case(impl, opts, True, warmup=1, repeats=3)
        try:
            m = measure.measure(c)
            try:
                p = measure.predict(dataclasses.replace(c, method="predicted"), Budget())
            except Exception as e:
                p = dataclasses.replace(m, peak_bytes=0, baseline_bytes=0)
                print(f"  {impl:12} (predict: {first(e)})")
            sane = (m.baseline_bytes <= m.peak_bytes and (m.reserved_bytes is None or m.peak_bytes <= m.reserved_bytes)
                    and all(0 < t < 60 for t in m.times_s))
            fails += not sane
            ws = m.extra.get("workspace_bytes", 0)  # the cuBLAS workspace the warm-up left, inside the peak
            print(f"  {impl:12} peak {m.peak_bytes} reserved {m.reserved_bytes} baseline {m.baseline_bytes} "
                  f"workspace {ws} times_ms {[round(t * 1e3, 3) for t in m.times_s]} | predicted peak {p.peak_bytes} "
                  f"baseline {p.baseline_bytes} | measured (less the workspace)/predicted above baseline "
                  f"{(m.peak_bytes - ws - m.baseline_bytes) / max(1, p.peak_bytes - p.baseline_bytes):.2f}"
                  + ("" if sane else "  <-- INCONSISTENT"))
        except Exception as e:
            fails += 1
            print(f"  {impl:12} FAILED {first(e)}")
for msg in sorted({str(w.message).splitlines()[0][:160] for w in caught}):
    print("  warning:", msg)
print(f"  TF32 after measure: matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32} "
      f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} "
      f"matmul.fp32_precision={getattr(torch.backends.cuda.matmul, 'fp32_precision', 'n/a')}")

print("4) an allocation far beyond the device, through worker.classify")
if dev == "cuda":
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device=dev)
        print("  no error?!"); fails += 1
    except Exception as e:
        cc = case("vanilla", {}, True)  # a CUDA case: the device running out is oom, budget or not
        no_budget, with_budget = worker.classify(e, Budget(), cc)[0], worker.classify(e, Budget(max_memory_bytes=30 << 30), cc)[0]
        print(f"  {type(e).__name__} -> '{no_budget}' without a budget, '{with_budget}' with the default 30 GiB one")
        fails += no_budget != "oom" or with_budget != "oom"
print(f"PROBE FAILURES: {fails}")
raise SystemExit(1 if fails else 0)
EOF
    rc=$?
    sed -n '/^  /p' "$WORK/probe.log" >>"$SUMMARY"
    if [ "$rc" -eq 0 ]; then pass "probe: every implementation builds, runs and agrees with the CPU on $DEV"; else fail "probe (probe.log)"; fi
    snap
fi

# ---------------------------------------------------------------- topk-bench doctor on the device
if want doctor && [ "$CLI_OK" = 1 ]; then
    logged doctor "$(cap 240)" "${TB[@]}" doctor --device "$DEV"
    rc=$?
    grep -E "fail|FAIL|skipped|checks" "$WORK/doctor.log" | sed 's/^/      | /' >>"$SUMMARY"
    if [ "$rc" -eq 0 ]; then pass "topk-bench doctor --device $DEV"; else fail "topk-bench doctor --device $DEV (doctor.log)"; fi
    snap
fi

# ---------------------------------------------------------------- tests that touch CUDA
if want tests; then
    if "$PY" -c 'import pytest' 2>/dev/null; then
        logged tests "$(cap 150)" "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py tests/test_measure.py \
            tests/test_memory.py tests/test_compare.py tests/test_suite_validation.py -k cuda
        if [ $? -eq 0 ]; then pass "pytest -k cuda"; else fail "pytest -k cuda (tests.log)"; fi
    else
        warn "pytest is not installed: tests step skipped"
    fi
    snap
fi

# ---------------------------------------------------------------- smoke suite
if want smoke && [ "$CLI_OK" = 1 ]; then
    logged smoke "$(cap 180)" "${TB[@]}" run suites/smoke.toml --device "$DEV" --out "$WORK/smoke" --no-resume
    rc=$?
    if report status "$WORK/smoke" ok && [ "$rc" -eq 0 ]; then pass "smoke on $DEV: every case ok"; else fail "smoke on $DEV (smoke.log)"; fi
    snap
fi

# ---------------------------------------------------------------- two consecutive runs of ci.toml, compared
if want ci && [ "$CLI_OK" = 1 ]; then
    logged ci_run1 "$(cap 220)" "${TB[@]}" run suites/ci.toml --device "$DEV" --out "$WORK/ci1" --no-resume
    rc1=$?
    logged ci_run2 "$(cap 220)" "${TB[@]}" run suites/ci.toml --device "$DEV" --out "$WORK/ci2" --no-resume
    rc2=$?
    if report status "$WORK/ci2" ok && [ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ]; then pass "ci.toml on $DEV: every case ok"; else fail "ci.toml on $DEV has cases that are not ok"; fi
    logged ci_compare "$(cap 90)" "${TB[@]}" compare "$WORK/ci1" "$WORK/ci2" --markdown "$WORK/compare.md" --json "$WORK/benchmark.json"
    case $? in
        0) pass "compare of two consecutive $DEV runs: no regression" ;;
        1) fail "compare flags a regression between two identical runs (noise; see ci_compare.log)" ;;
        *) fail "compare did not run or refused its input (ci_compare.log)" ;;
    esac
    report diff "$WORK/ci1" "$WORK/ci2"
    case $? in
        0) pass "peak_bytes identical across the two runs" ;;
        1) warn "peak_bytes differ slightly between identical runs (within compare's 1.001 factor)" ;;
        *) fail "peak_bytes differ between identical runs beyond compare's 1.001 factor, or no common ok case" ;;
    esac
    if [ -f "$WORK/benchmark.json" ]; then
        if report json "$WORK/benchmark.json"; then pass "benchmark.json is customSmallerIsBetter"; else fail "benchmark.json format"; fi
    else
        fail "compare --json wrote no benchmark.json"
    fi
    snap
fi

# ---------------------------------------------------------------- mha suite up to MHA_MAX_SEQ
if want mha && [ "$CLI_OK" = 1 ]; then
    MHA_SUITE=$WORK/mha_upto_$MHA_MAX_SEQ.toml
    if report upto "$MHA_MAX_SEQ" suites/mha.toml "$MHA_SUITE" >/dev/null; then
        logged mha "$(cap 420)" "${TB[@]}" run "$MHA_SUITE" --device "$DEV" --out "$WORK/mha" --no-resume \
            --max-memory "$MHA_MAX_GIB" --max-case-seconds 120
        rc=$?
        if report status "$WORK/mha" ok,over_budget,skipped && [ "$rc" -eq 0 ]; then
            pass "mha up to L=$MHA_MAX_SEQ on $DEV (budget $MHA_MAX_GIB GiB)"
        else
            fail "mha up to L=$MHA_MAX_SEQ on $DEV (mha.log; if it hit its limit, give it a call of its own: STEPS=mha)"
        fi
    else
        fail "could not derive the mha suite"
    fi
    snap
fi

say "RESULT: $FAILS failed check(s) in $(($(date +%s) - START))s; logs and CSVs in $OUT/gpu_check.tar.gz"
snap
rm -rf "$WORK"
[ "$FAILS" -eq 0 ]
