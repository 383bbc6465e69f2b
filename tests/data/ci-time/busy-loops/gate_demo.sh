#!/usr/bin/env bash
# The time gate's must-show (issue 52): at a load of about 2 per core (two busy loops beside the gate on 2
# cores), unchanged code passes and a 1.3x slowdown of topk_fast fails, three times each.
set -u
cd /work/demo/clone
export PYTHONPATH=/work/demo/clone
RUNS=/work/demo/runs; rm -rf "$RUNS"; mkdir -p "$RUNS"
SUMMARY=$RUNS/summary.txt
for i in 1 2 3; do
  for kind in unchanged slowed; do
    name=$kind-$i
    sh -c 'while :; do :; done' & b1=$!
    sh -c 'while :; do :; done' & b2=$!
    ( while :; do echo "$(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 30; done ) > "$RUNS/$name.load" & lw=$!
    start=$(date +%s)
    if [ $kind = slowed ]; then export TOPK_BENCH_TEST_SLOWDOWN=topk_fast=1.3; else unset TOPK_BENCH_TEST_SLOWDOWN; fi
    /work/main/.venv/bin/python -m topk_bench gate --base HEAD --out "$RUNS/$name" > "$RUNS/$name.log" 2>&1
    code=$?
    end=$(date +%s)
    kill $b1 $b2 $lw 2>/dev/null; wait $b1 $b2 $lw 2>/dev/null
    loads=$(awk '{print $2}' "$RUNS/$name.load" | sort -n | sed -n '1p;$p' | paste -sd- )
    echo "$name exit=$code $((end-start)) s load(1-min)=$loads :: $(tail -n 1 "$RUNS/$name.log" | cut -c1-200)" >> "$SUMMARY"
    grep -E "^  [a-z]" "$RUNS/$name.log" | head -5 >> "$SUMMARY"
  done
done
echo done >> "$SUMMARY"
