#!/usr/bin/env bash
# Issue 4 on the device (after stage.sh's two calls; see its header): the kernel tests compiled,
# the engine's kernel path against the reference path, then the kernel and agreement benchmarks.
# Results go to $OUT/results, every log to $OUT/run.log (the device tool brings back few files).
set -uo pipefail
. /root/vegas-env
export TRITON_INTERPRET=0
mkdir -p "$OUT/results"
step() { local name=$1 limit=$2; shift 2; echo "== $name" | tee -a "$OUT/run.log"; local t=$SECONDS
  timeout "$limit" "$@" > "$OUT/step.log" 2>&1; local rc=$?
  cat "$OUT/step.log" >> "$OUT/run.log"; echo "rc=$rc ${name} $((SECONDS - t))s" | tee -a "$OUT/steps.txt"
  grep -v '%|' "$OUT/step.log" | tail -n "${TAIL:-25}"; rm -f "$OUT/step.log"; }
step tests 150 python3 -m pytest -q -x tests/kernels tests/vegas_core/test_kernel_backend.py
TAIL=70 step kernels 260 python3 -m vegas_core.bench kernels --out "$OUT/results" "$@"
TAIL=20 step agreement 280 python3 -m vegas_core.bench agreement --model "$VEGAS_DEVICE_MODEL" --out "$OUT/results"
