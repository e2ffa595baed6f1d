#!/usr/bin/env bash
# Issue 4 on the device (after stage.sh's two calls; see its header): the kernel tests compiled,
# the engine's kernel path against the reference path, then the kernel and agreement benchmarks.
# Results and logs go to $OUT (the device tool brings them back).
set -uo pipefail
. /root/vegas-env
export TRITON_INTERPRET=0
step() { local name=$1; shift; echo "== $name"; local t=$SECONDS
  timeout "$STEP_LIMIT" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$? ${name} $((SECONDS - t))s" | tee -a "$OUT/steps.txt"
  tail -n "${TAIL:-25}" "$OUT/$name.log"; }
mkdir -p "$OUT/results"
STEP_LIMIT=150 step tests python3 -m pytest -q -x tests/kernels tests/vegas_core/test_kernel_backend.py
STEP_LIMIT=240 TAIL=60 step kernels python3 -m vegas_core.bench kernels --out "$OUT/results" "$@"
STEP_LIMIT=240 TAIL=20 step agreement python3 -m vegas_core.bench agreement --model "$VEGAS_DEVICE_MODEL" \
  --gen-tokens 64 --out "$OUT/results"
for m in vanilla vegas; do
  STEP_LIMIT=120 TAIL=12 step "decode-$m" python3 -m vegas_core.bench decode --model "$VEGAS_DEVICE_MODEL" \
    --batch 64 --context 4096 --gen-tokens 48 --method "$m" --out "$OUT/decode-$m"
done
