#!/usr/bin/env bash
# GPU acceptance of topk-bench: what only a GPU can confirm, in two calls of at most 10 minutes each (and a third
# for whatever the first two could not finish), the most valuable steps first, within a 30-minute device budget
# (machine starts included).
#
# Run from the root of a copy of the project, on a machine with a CUDA GPU and a CUDA build of torch:
#     PHASE=1 OUT=/somewhere bash scripts/gpu_acceptance.sh   # ~9 min: set-up, forks, doctor, ci.toml, profiles
#     PHASE=2 OUT=/somewhere bash scripts/gpu_acceptance.sh   # ~9 min: mha.toml to 64K, kv_targets, topk_fast vs SDPA
#     PHASE=3 STEPS="..." OUT=/somewhere bash scripts/gpu_acceptance.sh   # steps again, after a fix
# With the device tool: one `run` per phase, timeout_s 600, carry [".wheels"] (the project's dependencies the
# GPU image lacks: /work/shared/gpu/README.md), command `PHASE=N bash scripts/gpu_acceptance.sh`; OUT is the
# tool's. Phases 1 and 2 run back to back on one warm machine (a machine goes back 30 s after a call).
#
# Steps, by phase (STEPS overrides; each step is skipped when the call's time budget is spent):
#   1  env      the GPU, torch, CUDA, driver, clocks (nvidia-smi)
#      setup    the README's set-up, as a user runs it: scripts/setup.sh into .venv, which keeps the machine's
#               CUDA torch (offline: PIP_NO_INDEX with WHEELHOUSE as PIP_FIND_LINKS); .venv/bin/topk-bench from
#               there on. When it fails (FAIL), `install` runs instead: the missing dependencies from WHEELHOUSE
#               and the project on PYTHONPATH, so that the other steps still say what they can
#      forks    a tiny suite measured on the GPU: each case's child is forked from the warm template in this
#               CUDA build (FAIL: "cases start as fresh interpreters"); the children's start-up
#      doctor   `topk-bench doctor --device cuda` green (it compares with --predict --device cuda's numbers
#               within their stated accuracy, and skips what torch.compile refuses, with the reason)
#      ci       suites/ci.toml measured, and predicted with --device cuda: every case's peak above the
#               baseline within 1 MiB of the prediction and reserved within 5% (the gap table either way)
#      profile  `topk-bench profile` on CUDA: ci.toml's mha/qchunk_paper (its allocator history explains its
#               reserved bytes), mha.toml's vanilla and topk at 8K; peak.csv adds up to each peak, each
#               snapshot.pickle opens and torch's memory_viz draws it
#   2  mha      suites/mha.toml measured up to MHA_MAX_SEQ (64K) tokens, and predicted (--device cuda) beside it:
#               Fig. 1 on the GPU
#      kv       suites/kv_targets.toml measured with timer = "cudagraph" (no host dispatch in the time), then
#               with events (the same cases: the two side by side say which are dispatch-bound), and the host's
#               cost of launching one op (ops_per_iter x that cost against the time)
#      fast     suites/topk_fast_cuda.toml: topk_fast against SDPA, causal BERT-base MHA forward + backward,
#               4K to 64K, float32 and bfloat16
#      compiled suites/topk_fast_cuda_compiled.toml: the same two with compile = true at 16K, bfloat16 then float32
# Optional steps, in no phase: install, trace (scripts/trace_template_threads.py: which call of the template's
# warm-up starts a thread, when forks fails), smoke (suites/smoke.toml), tests (pytest -k cuda).
#
# What it writes under $OUT (at most 8 files come back from the device tool): summary-PHASE.txt (PASS / FAIL /
# WARN lines and each step's table), gpu_check-PHASE.tar.gz (every log and CSV), the measured CSVs of phase 1
# and csv-PHASE.tar.gz: the measured CSVs, the reference data (phase 1: ci-cuda.csv, ci-cuda-predicted.csv,
# doctor.txt; phase 2: mha-cuda.csv, mha-cuda-predicted.csv, kv_targets-cudagraph.csv, kv_targets-events.csv,
# topk_fast-cuda-*.csv), and phase 1's profiles-1.tar.gz. All are rewritten after each step, so a call cut off
# at its limit still leaves what it had done.
#
# Knobs (environment):
#   PHASE        1, 2 or 3 (default 1); BUDGET_S: this call's wall-clock budget (default 550; 3: 400)
#   OUT          output folder (default ./gpu_check_out); PYTHON: the interpreter with torch (default python3)
#   WHEELHOUSE   folder of carried wheels (default ./.wheels, else ./wheels)
#   MHA_MAX_SEQ  largest seq_len of the mha step (default 65536); MHA_MIN_SEQ its smallest (default 0: all);
#                MHA_MAX_GIB its --max-memory (default 75)
#   KV_TIMERS    the kv step's timers (default "cudagraph events"); FAST_DTYPES the fast step's ("float32 bfloat16")
#   KV_ROUNDS    rounds of the kv step (default 3: kv_targets' 5 do not fit beside events in one call)
#   FAST_SUITE, COMPILED_SUITE  the suites of the fast and compiled steps (defaults above)
#   PATHS        the CUDA paths the kv, fast and compiled steps measure, each in turn: "default" (TOPK_BENCH_TRITON
#                as given; unset: the per-operation defaults of topk_bench/attention/kernels/triton/defaults.py),
#                "triton" (TOPK_BENCH_TRITON=1: the Triton kernels wherever they take the call), "torch"
#                (TOPK_BENCH_TRITON=0). Default "default"; PHASE=3: "default triton", the two side by side in one
#                call. A path other than "default" suffixes its logs, folders and kept CSVs with -PATH
#   ALLOW_CPU=1  dry run without CUDA (device cpu): tests this script itself, proves nothing about GPUs
# Exit status: 0 every check of the call passed, 1 some check failed, 2 no usable torch (with CUDA).
set -uo pipefail

ROOT=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/gpu_check_out}
PHASE=${PHASE:-1}
case $PHASE in
    1) DEFAULT_STEPS="env setup forks doctor ci profile"; DEFAULT_BUDGET=550 ;;
    2) DEFAULT_STEPS="env setup mha kv fast compiled"; DEFAULT_BUDGET=550 ;;
    3) DEFAULT_STEPS="env setup"; DEFAULT_BUDGET=400 ;;
    *) echo "PHASE must be 1, 2 or 3, got '$PHASE'" >&2; exit 2 ;;
esac
STEPS=${STEPS:-$DEFAULT_STEPS}
DEFAULT_PATHS=default
[ "$PHASE" = 3 ] && DEFAULT_PATHS="default triton"
PATHS=${PATHS:-$DEFAULT_PATHS}
for path in $PATHS; do
    case $path in
        default | triton | torch) ;;
        *) echo "PATHS: each must be default, triton or torch, got '$path'" >&2; exit 2 ;;
    esac
done
BUDGET_S=${BUDGET_S:-$DEFAULT_BUDGET}
MHA_MAX_SEQ=${MHA_MAX_SEQ:-65536}
MHA_MIN_SEQ=${MHA_MIN_SEQ:-0}
KV_TIMERS=${KV_TIMERS:-cudagraph events}
FAST_DTYPES=${FAST_DTYPES:-float32 bfloat16}
MHA_MAX_GIB=${MHA_MAX_GIB:-75}
KV_ROUNDS=${KV_ROUNDS:-3}
FAST_SUITE=${FAST_SUITE:-suites/topk_fast_cuda.toml}
COMPILED_SUITE=${COMPILED_SUITE:-suites/topk_fast_cuda_compiled.toml}
WHEELHOUSE=${WHEELHOUSE:-}
if [ -z "$WHEELHOUSE" ]; then
    for d in "$ROOT/.wheels" "$ROOT/wheels"; do [ -d "$d" ] && WHEELHOUSE=$d && break; done
fi
START=$(date +%s)
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
SUMMARY=$OUT/summary-$PHASE.txt
: >"$SUMMARY"
FAILS=0
DEV=cuda
MIB=1048576
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

say()  { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
pass() { say "PASS  $*"; }
fail() { say "FAIL  $*"; FAILS=$((FAILS + 1)); }
warn() { say "WARN  $*"; }
snap() {  # everything so far into $OUT/gpu_check-PHASE.tar.gz, the kept CSVs into $OUT/csv-PHASE.tar.gz
    cp "$SUMMARY" "$WORK/summary.txt" 2>/dev/null
    tar czf "$WORK.tgz" -C "$WORK" --exclude=./profiles --exclude=./keep . 2>/dev/null \
        && mv -f "$WORK.tgz" "$OUT/gpu_check-$PHASE.tar.gz"
    if [ -n "$(ls -A "$WORK/keep" 2>/dev/null)" ]; then
        tar czf "$WORK.csv.tgz" -C "$WORK/keep" . 2>/dev/null && mv -f "$WORK.csv.tgz" "$OUT/csv-$PHASE.tar.gz"
    fi
}
keep() {  # keep SRC (a results folder's CSV, or a file) as NAME in csv-PHASE.tar.gz, the reference data
    local csv=$1
    [ -d "$1" ] && csv=$(ls "$1"/*.csv 2>/dev/null | head -n 1)
    mkdir -p "$WORK/keep"
    [ -n "$csv" ] && [ -f "$csv" ] && cp "$csv" "$WORK/keep/$2"
}
trap 'say "interrupted"; snap; exit 143' TERM INT
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
left() { echo $((START + BUDGET_S - $(date +%s))); }
cap()  { local l=$(($(left) - 10)); if [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi; }
# logged NAME SECONDS CMD...: run CMD with a time limit, output in $WORK/NAME.log; returns CMD's status
logged() {
    local name=$1 secs=$2 rc
    shift 2
    if [ "$secs" -lt 20 ]; then
        warn "$name: not run, this call's time budget (BUDGET_S=$BUDGET_S) is spent"
        return 125
    fi
    say "----- $name (limit ${secs}s, $(($(date +%s) - START))s elapsed): $*"
    timeout -k 10 -s TERM "$secs" "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    [ "$rc" -eq 124 ] && warn "$name: stopped at its ${secs}s limit (finished rows are kept)"
    tail -n 3 "$WORK/$name.log" | sed 's/^/      | /' >>"$SUMMARY"
    return "$rc"
}
report() { "$PY" "$ROOT/scripts/gpu_report.py" "$@" 2>&1 | tee -a "$SUMMARY"; return "${PIPESTATUS[0]}"; }
# on_path PATH: set PENV (the command prefix that selects PATH: `env`, with TOPK_BENCH_TRITON for triton and torch),
# SFX (the suffix of its logs, folders and CSVs) and ON (how the summary names it)
on_path() {
    case $1 in
        default) PENV=(env); SFX=""; ON="" ;;
        triton) PENV=(env TOPK_BENCH_TRITON=1); SFX="-triton"; ON=" (TOPK_BENCH_TRITON=1)" ;;
        torch) PENV=(env TOPK_BENCH_TRITON=0); SFX="-torch"; ON=" (TOPK_BENCH_TRITON=0)" ;;
    esac
}

# measured NAME SECS DIR CSV STATUSES WHAT OK_NOTE -- COMMAND...: COMMAND on the path on_path chose, its results in
# DIR (kept as CSV): PASS "WHAT OK_NOTE" when it exits 0 and every row has one of STATUSES, else FAIL naming its log
measured() {
    local name=$1 secs=$2 dir=$3 csv=$4 statuses=$5 what=$6 ok_note=$7 rc
    shift 8
    logged "$name" "$secs" "${PENV[@]}" "$@" --out "$dir" --no-resume
    rc=$?
    keep "$dir" "$csv"
    if report status "$dir" "$statuses" && [ "$rc" -eq 0 ]; then
        pass "$what$ok_note"
    else
        fail "$what ($name.log)"
    fi
}

say "gpu_acceptance phase $PHASE: $(date -u +%FT%TZ) root=$ROOT python=$PY steps='$STEPS' paths='$PATHS' budget=${BUDGET_S}s"

# ---------------------------------------------------------------- torch with CUDA?
if ! "$PY" -c 'import torch; print(torch.cuda.is_available())' >"$WORK/env.out" 2>"$WORK/env.err"; then
    say "FATAL: '$PY' cannot import torch ($(tail -n 1 "$WORK/env.err")). Set PYTHON to an interpreter with a CUDA build."
    snap
    exit 2
fi
if [ "$(tail -n 1 "$WORK/env.out")" != "True" ]; then
    if [ "${ALLOW_CPU:-0}" = 1 ]; then
        DEV=cpu
        warn "torch.cuda.is_available() is False: DRY RUN on the CPU (ALLOW_CPU=1); nothing here is about GPUs"
    else
        say "FATAL: torch imports but torch.cuda.is_available() is False (a CPU-only build, or no driver/GPU)."
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
      f"cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else '-'}  "
      f"CPU {torch.backends.cpu.get_cpu_capability()}  CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    print(f"GPU 0 of {torch.cuda.device_count()}: {p.name}, sm_{p.major}{p.minor}, {total / 2**30:.1f} GiB "
          f"({free / 2**30:.1f} free), {p.multi_processor_count} SMs, L2 {p.L2_cache_size / 2**20:.0f} MiB")
EOF
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.max.sm,clocks.mem \
        --format=csv 2>&1 | sed 's/^/      | /' | tee -a "$SUMMARY"
    snap
fi

# ---------------------------------------------------------------- setup, as a user runs it (else: install)
TB=("$PY" -m topk_bench)
missing_deps() {  # what `topk-bench run` imports
    "$PY" - <<'EOF2'
import importlib.util, sys
mods = {"performer_pytorch": "performer-pytorch", "local_attention": "local-attention",
        "axial_positional_embedding": "axial-positional-embedding", "einops": "einops", "pandas": "pandas",
        "matplotlib": "matplotlib", "typer": "typer", "rich": "rich", "pydantic": "pydantic", "scipy": "scipy",
        "filelock": "filelock"}
if sys.version_info < (3, 11):
    mods["tomli"] = "tomli"
print(" ".join(pkg for mod, pkg in mods.items() if importlib.util.find_spec(mod) is None))
EOF2
}
VENV=$ROOT/.venv
if want setup; then
    if [ -x "$VENV/bin/topk-bench" ] && "$VENV/bin/python" -c 'import topk_bench.cli' >/dev/null 2>&1; then
        say "      set-up: $VENV from an earlier call"
        SETUP_OK=1
    else
        SETUP_ENV=()
        [ -n "$WHEELHOUSE" ] && SETUP_ENV=(PIP_NO_INDEX=1 "PIP_FIND_LINKS=$WHEELHOUSE")
        # The interpreter holding the CUDA torch is python3 for scripts/setup.sh, as on a user's GPU box.
        PYDIR=$(dirname "$(command -v "$PY")")
        logged setup "$(cap 180)" env "${SETUP_ENV[@]}" "PATH=$PYDIR:$PATH" bash scripts/setup.sh "$VENV" dev
        SETUP_OK=$([ $? -eq 0 ] && echo 1 || echo 0)
    fi
    if [ "$SETUP_OK" = 1 ] && "$VENV/bin/python" -c 'import torch, topk_bench.cli; print(torch.__version__, torch.cuda.is_available())' \
        >"$WORK/setup.check" 2>&1; then
        PY=$VENV/bin/python
        TB=("$VENV/bin/topk-bench")
        pass "set-up (scripts/setup.sh into .venv): torch $(cut -d' ' -f1 "$WORK/setup.check"), CUDA available: $(cut -d' ' -f2 "$WORK/setup.check")"
        [ "$DEV" = cuda ] && ! grep -q " True" "$WORK/setup.check" && fail "set-up: .venv's torch does not see CUDA"
    else
        fail "set-up (scripts/setup.sh): .venv has no working topk-bench (setup.log); the project on PYTHONPATH instead"
        STEPS="$STEPS install"
    fi
    snap
fi
if want install; then
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the launcher's children get it too
    MISSING=$(missing_deps)
    if [ -n "$MISSING" ] && [ -n "$WHEELHOUSE" ]; then
        say "missing: $MISSING; installing from the wheelhouse $WHEELHOUSE"
        timeout 120 "$PY" -m pip install -q --no-index --no-deps --find-links "$WHEELHOUSE" "$WHEELHOUSE"/*.whl \
            >>"$WORK/install.log" 2>&1 || say "      some wheels did not install into the interpreter (install.log)"
        MISSING=$(missing_deps)
        if [ -n "$MISSING" ]; then  # a read-only site-packages: a folder of our own on PYTHONPATH
            timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/topk-bench-site \
                "$WHEELHOUSE"/*.whl >>"$WORK/install.log" 2>&1
            export PYTHONPATH="$PYTHONPATH:/tmp/topk-bench-site"
            MISSING=$(missing_deps)
        fi
    fi
    [ -n "$MISSING" ] && warn "still missing: $MISSING (carry their wheels in WHEELHOUSE)"
    if ! "$PY" -c 'import topk_bench.run.runner, topk_bench.report.compare' >>"$WORK/install.log" 2>&1; then
        fail "topk_bench does not import ($(tail -n 1 "$WORK/install.log")); nothing more can run"
        snap
        exit 1
    fi
    pass "the project imports (from $ROOT, through PYTHONPATH)"
    snap
fi

# ---------------------------------------------------------------- forks: the warm template in this build
if want forks; then
    cat >"$WORK/forks.toml" <<'EOF'
name = "forks"
workload = "mha"
repeats = 2
[shape]
d_model = 64
heads = 4
[sweep]
seq_len = [128, 256]
[[impl]]
name = "vanilla"
[[impl]]
name = "sdpa"
EOF
    logged forks "$(cap 120)" "${TB[@]}" run "$WORK/forks.toml" --device "$DEV" --out "$WORK/forks" --no-resume
    rc=$?
    if grep -q "fresh interpreters" "$WORK/forks.log"; then
        fail "forks: the template did not fork in this build: $(grep -o 'fresh interpreters.*' "$WORK/forks.log" | head -n 1)"
    elif [ "$rc" -eq 0 ] && report status "$WORK/forks" ok; then
        pass "forks: every case's child forked from the warm template (no fresh-interpreter notice)"
    else
        fail "forks: the tiny suite did not run (forks.log)"
    fi
    snap
fi

# ---------------------------------------------------------------- trace: where the template gains a thread
if want trace; then
    logged trace "$(cap 120)" "$PY" scripts/trace_template_threads.py vanilla sdpa qchunk topk topk_fast performer
    if [ $? -eq 0 ]; then
        pass "trace: the template's warm-up keeps one thread (it can fork)"
    else
        fail "trace: the template's warm-up starts a thread (trace.log names the call)"
        grep -A 40 "started thread" "$WORK/trace.log" | tail -n 25 | sed 's/^/      | /' >>"$SUMMARY"
    fi
    snap
fi

# ---------------------------------------------------------------- doctor
if want doctor; then
    logged doctor "$(cap 240)" "${TB[@]}" doctor --device "$DEV"
    rc=$?
    keep "$WORK/doctor.log" doctor.txt
    grep -E "fail|skipped|checks" "$WORK/doctor.log" | sed 's/^/      | /' >>"$SUMMARY"
    if [ "$rc" -eq 0 ]; then pass "topk-bench doctor --device $DEV"; else fail "topk-bench doctor --device $DEV (doctor.txt)"; fi
    snap
fi

# ---------------------------------------------------------------- ci.toml measured, against its CUDA prediction
if want ci; then
    # The prediction runs on the host only: beside the measurement (memory is what the two are compared on).
    "${TB[@]}" run suites/ci.toml --predict --device "$DEV" --out "$WORK/ci-predicted" --no-resume -q \
        >"$WORK/ci_predicted.log" 2>&1 &
    PREDICTING=$!
    logged ci "$(cap 240)" "${TB[@]}" run suites/ci.toml --device "$DEV" --out "$WORK/ci" --no-resume
    rc=$?
    wait "$PREDICTING" || say "      the prediction failed: $(tail -n 1 "$WORK/ci_predicted.log")"
    keep "$WORK/ci" ci-cuda.csv
    if report status "$WORK/ci" ok && [ "$rc" -eq 0 ]; then pass "ci.toml on $DEV: every case ok"; else fail "ci.toml on $DEV (ci.log)"; fi
    keep "$WORK/ci-predicted" ci-cuda-predicted.csv
    say "      measured (less the cuBLAS workspace) against --predict --device $DEV:"
    if report gaps "$WORK/ci" "$WORK/ci-predicted"; then
        pass "ci.toml: every case predicted within 1 MiB above the baseline, reserved within 5%"
    else
        fail "ci.toml: cases off their CUDA prediction (the table above)"
    fi
    snap
fi

# ---------------------------------------------------------------- profile on CUDA: peak attribution, snapshots
if want profile; then
    PROFILES=$WORK/profiles
    logged profile_qchunk "$(cap 120)" "${TB[@]}" profile suites/ci.toml --case workload=mha,impl=qchunk_paper \
        --device "$DEV" --out "$PROFILES/ci"
    for impl in vanilla topk; do
        logged "profile_$impl" "$(cap 150)" "${TB[@]}" profile suites/mha.toml --case "impl=$impl,seq_len=8192" \
            --device "$DEV" --out "$PROFILES/mha"
    done
    if report profiles "$PROFILES" 3; then
        pass "profile on $DEV: peak.csv adds up to each peak above its baseline, snapshots open"
    else
        fail "profile on $DEV (profile_*.log and the table above)"
    fi
    # torch's own viewer of a snapshot (what memory_viz's page loads): it must draw each one.
    for snapshot in "$PROFILES"/*/*/snapshot.pickle; do
        [ -f "$snapshot" ] || continue
        if "$PY" -m torch.cuda._memory_viz trace_plot "$snapshot" -o "${snapshot%.pickle}.html" >>"$WORK/memory_viz.log" 2>&1 \
            && [ -s "${snapshot%.pickle}.html" ]; then
            pass "memory_viz draws $(basename "$(dirname "$snapshot")")/snapshot.pickle"
        else
            fail "memory_viz cannot draw $snapshot (memory_viz.log)"
        fi
    done
    # A file over 16 MiB does not come back from the device tool: the drawings go first, then the traces.
    for leave_out in "" "--exclude=*.html" "--exclude=*.html --exclude=trace.json"; do
        # shellcheck disable=SC2086  # the exclusions are words
        tar czf "$OUT/profiles-$PHASE.tar.gz" -C "$PROFILES" $leave_out . 2>/dev/null
        [ "$(stat -c %s "$OUT/profiles-$PHASE.tar.gz")" -lt $((15 * MIB)) ] && break
    done
    [ -n "$leave_out" ] && warn "profiles-$PHASE.tar.gz packed without $leave_out (15 MiB at most)"
    snap
fi

# ---------------------------------------------------------------- mha.toml up to MHA_MAX_SEQ
if want mha; then
    MHA_SUITE=$WORK/mha_upto_$MHA_MAX_SEQ.toml
    if report upto "$MHA_MAX_SEQ" suites/mha.toml "$MHA_SUITE" "$MHA_MIN_SEQ" >/dev/null; then
        # The prediction (host only) beside the measurement, for the figure: measured and predicted reserved bytes.
        "${TB[@]}" run "$MHA_SUITE" --predict --device "$DEV" --out "$WORK/mha-predicted" --no-resume -q \
            >"$WORK/mha_predicted.log" 2>&1 &
        PREDICTING=$!
        # Memory beyond the budget is over_budget and the larger sizes are skipped: the budget bounds the time too.
        logged mha "$(cap 240)" "${TB[@]}" run "$MHA_SUITE" --device "$DEV" --out "$WORK/mha" --no-resume \
            --max-memory "$MHA_MAX_GIB" --max-case-seconds 60
        rc=$?
        wait "$PREDICTING"
        keep "$WORK/mha" mha-cuda.csv
        keep "$WORK/mha-predicted" mha-cuda-predicted.csv
        if report status "$WORK/mha" ok,over_budget,oom,skipped && [ "$rc" -eq 0 ]; then
            pass "mha up to L=$MHA_MAX_SEQ on $DEV (budget $MHA_MAX_GIB GiB)"
        else
            fail "mha up to L=$MHA_MAX_SEQ on $DEV (mha.log)"
        fi
    else
        fail "could not derive the mha suite"
    fi
    snap
fi

# ---------------------------------------------------------------- kv_targets.toml: graph replays, then events
if want kv; then
    # The host's cost of launching one small op (an in-place add of one element), for ops_per_iter x that cost.
    DISPATCH_S=$("$PY" - "$DEV" <<'EOF2' 2>>"$WORK/dispatch.log"
import sys, time, torch
x = torch.zeros(1, device=sys.argv[1])
for n in (2000, 20000):  # the first round warms up
    torch.cuda.synchronize() if x.is_cuda else None
    start = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    launched = time.perf_counter() - start
    torch.cuda.synchronize() if x.is_cuda else None
print(f"{launched / n:.3e}")
EOF2
)
    say "      the host launches one op in $DISPATCH_S s"
    for timer in $KV_TIMERS; do
        [ "$DEV" = cpu ] && [ "$timer" = cudagraph ] && continue  # the CPU has one timer
        for path in $PATHS; do
            on_path "$path"
            measured "kv_$timer$SFX" "$(cap 300)" "$WORK/kv-$timer$SFX" "kv_targets-$timer$SFX.csv" ok \
                "kv_targets with timer = $timer$ON" ": every case ok (times and ratios to dense below)" -- \
                "${TB[@]}" run suites/kv_targets.toml --device "$DEV" --timer "$timer" --rounds "$KV_ROUNDS"
            report times "$WORK/kv-$timer$SFX" "$DISPATCH_S"
            snap
        done
    done
fi

# ---------------------------------------------------------------- topk_fast against SDPA, eager, then compiled
# float32 as the suite has it, then bfloat16 (the same suite with its dtype changed).
variant() {  # variant SUITE DTYPE: the suite (its name suffixed) in WORK, measured in DTYPE
    local name
    name=$(basename "$1" .toml)-$2
    # the suite's own name and dtype: the first of each (an [[impl]] has a name too)
    sed -e "0,/^dtype = .*/s//dtype = \"$2\"/" -e "0,/^name = .*/s//name = \"$name\"/" "$1" >"$WORK/$name.toml"
    echo "$WORK/$name.toml"
}
for step in fast compiled; do
    want $step || continue
    SUITE=$FAST_SUITE
    [ $step = compiled ] && SUITE=$COMPILED_SUITE
    DTYPES=$FAST_DTYPES
    [ $step = compiled ] && DTYPES="bfloat16 float32"   # compilation takes long: the dtype users run first
    for dtype in $DTYPES; do
        V=$(variant "$SUITE" "$dtype")
        for path in $PATHS; do
            on_path "$path"
            measured "${step}_$dtype$SFX" "$(cap 200)" "$WORK/$step-$dtype$SFX" "$(basename "$V" .toml)$SFX.csv" \
                ok,over_budget,oom,skipped "$(basename "$SUITE") in $dtype on $DEV$ON" "" -- \
                "${TB[@]}" run "$V" --device "$DEV"
            report times "$WORK/$step-$dtype$SFX"
            snap
        done
    done
done

# ---------------------------------------------------------------- optional: smoke suite, CUDA tests
if want smoke; then
    logged smoke "$(cap 180)" "${TB[@]}" run suites/smoke.toml --device "$DEV" --out "$WORK/smoke" --no-resume
    if report status "$WORK/smoke" ok,unsupported; then pass "smoke on $DEV"; else fail "smoke on $DEV (smoke.log)"; fi
    snap
fi
if want tests; then
    logged tests "$(cap 150)" "$PY" -m pytest -q -p no:cacheprovider tests/measure/test_cuda_backend.py tests/measure/test_timing.py \
        tests/measure/test_backends.py -k cuda
    if [ $? -eq 0 ]; then pass "pytest -k cuda"; else fail "pytest -k cuda (tests.log)"; fi
    snap
fi

say "RESULT phase $PHASE: $FAILS failed check(s) in $(($(date +%s) - START))s; logs and CSVs in $OUT/gpu_check-$PHASE.tar.gz"
snap
rm -rf "$WORK"
[ "$FAILS" -eq 0 ]
