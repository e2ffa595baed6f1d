#!/usr/bin/env bash
# Issue 5 on the device (after stage.sh's two calls; see its header): where a decode step's time
# goes, then the end-to-end comparison on the long-input workload. Results to $OUT/results.
set -uo pipefail
. /root/vegas-env
export TRITON_INTERPRET=0
mkdir -p "$OUT/results"
timeout 120 python3 scripts/device/profile_step.py vanilla 64 4096 > "$OUT/profile-vanilla.txt" 2>&1
timeout 120 python3 scripts/device/profile_step.py vegas 64 4096 > "$OUT/profile-vegas.txt" 2>&1
head -45 "$OUT/profile-vegas.txt"
timeout 340 python3 -m vegas_core.bench e2e --model "$VEGAS_DEVICE_MODEL" --workload long-input --batch 64 \
  --sampling greedy --out "$OUT/results" "$@" > "$OUT/e2e.log" 2>&1; echo "e2e rc=$?"
grep -v '%|' "$OUT/e2e.log" | tail -20
