#!/usr/bin/env bash
# A short follow-up run: the kernel benchmark at the target shape only (eager copy bandwidth), and
# the kernel path against the reference path in float32 (rounding out of the way).
set -uo pipefail
. /root/vegas-env
export TRITON_INTERPRET=0
mkdir -p "$OUT/results"
timeout 100 python3 -m vegas_core.bench kernels --batch 64 --context 8192 --sweep-rows 2 8 16 --no-tune \
  --out "$OUT/results" > "$OUT/kernels.log" 2>&1; echo "kernels rc=$?"; grep -v '%|' "$OUT/kernels.log" | tail -30
timeout 130 python3 -m vegas_core.bench agreement --model "$VEGAS_DEVICE_MODEL" --dtype float32 --prompts 20 \
  --methods vegas quest stream --out "$OUT/results" > "$OUT/agreement.log" 2>&1; echo "agreement rc=$?"
grep -v '%|' "$OUT/agreement.log" | tail -12
