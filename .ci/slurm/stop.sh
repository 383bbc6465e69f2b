#!/usr/bin/env bash
# Stop the cluster started by .ci/slurm/start.sh in DIR (same default).
# Only the daemons whose pid files are in DIR are signalled; DIR is kept
# (logs) unless --clean is given.
set -euo pipefail

CLEAN=0
if [ "${1:-}" = "--clean" ]; then CLEAN=1; shift; fi
DIR="${1:-${TOPK_SLURM_DIR:-/tmp/topk-bench-slurm}}"

stop_pid_file() {
    local file="$1" pid
    [ -f "$file" ] || return 0
    pid="$(cat "$file")"
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" || true
    fi
    rm -f "$file"
}

# Slurm first (it still needs munge to say goodbye), then munge.
stop_pid_file "$DIR/run/slurmd.pid"
stop_pid_file "$DIR/run/slurmctld.pid"
stop_pid_file "$DIR/munge/munged.pid"
[ "$CLEAN" = 1 ] && rm -rf "$DIR"
echo "slurm-stop: stopped cluster in $DIR" >&2
