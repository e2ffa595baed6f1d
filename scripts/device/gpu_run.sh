#!/usr/bin/env bash
# The GPU path on the device (after stage.sh's two calls; see its header), in named stages so one
# call can run several: `bash scripts/device/gpu_run.sh tests smoke kernels`, later `... e2e`.
#   tests    the fused kernels and the CUDA-graph path compiled (real capture) against references
#   smoke    e2e long-input, vanilla and vegas only, greedy, 96 tokens: do graphs run, how fast
#   linear   the fused projections against the cuBLAS path, with the launch-configuration sweep;
#            the result is also kept at /root/linear-best.json (E2E_ARGS="--linear-configs ...")
#   linearab the same without the sweep: the engine's configurations, and the layer with PDL
#   ab       e2e greedy vanilla / stream / vegas once per variant: cuBLAS projections with and
#            without programmatic dependent launch, the fused ones for decode and draft steps, and
#            for every forward of up to 4,096 rows (verification too)
#   kernels  the kernel benchmark at the target shape (C2Q tile vs main-tile store, selection)
#   selk     the kernel table at batch 64 x 8K only (selection: two launches against one)
#   stests   selection (one launch and two), the fused layer kernels, verification attention (with
#            PDL), the fused projections and the CUDA-graph path, compiled
#   qtests   the row sort, Quest and selection, the fused layer kernels and the CUDA-graph path,
#            compiled (the kernels whose interpreter path differs: row blocks, the sort network)
#   quest    e2e greedy vanilla and quest (quest_positions' sort moved: does it cost on the GPU)
#   ab2      e2e greedy: the engine as it is, then with the one-launch selection, then with PDL
#            on verify_attention too, then both (vanilla / stream / vegas; specextend where
#            selection moves)
#   sparse   sparse_attention's tile x split sweep at batch 64 x 8K (and that shape's kernel table);
#            SHAPES="smollm2" for one head shape
#   sampling the batched sampler, PyTorch (sort) vs the Triton threshold search, at 64 and 576 rows
#   e2e      the full comparison: every method, greedy and model-card sampling, 256 tokens
#   tune     the paper's three-step (gamma, sparsity) tuning per method, which e2e uses; at the e2e's
#            256 tokens (TUNE_TOKENS): 128-token runs ranked settings differently from the e2e
#   ftests   the fused layer kernels, the fused projections (PDL included), sparse attention and
#            the CUDA-graph path, compiled
#   ktests   the attention kernels' tests compiled on the GPU (the fused split merge under real
#            concurrency)
#   merge    the fused split merge vs the merge kernel and register caps (--merge-tune), with that
#            shape's kernel table
#   order    verify_attention with and without unmasked tiles, sparse_attention's stages and warps
#            (--order-tune), with that shape's kernel table
#   layout   the attention kernels over token-major and head-major pools, pages of 16 and 64
#            (--layout-sweep), with that shape's kernel table
#   smokeall every method, greedy, 64 tokens
#   eager    the smoke run with --eager (what graphs buy, measured in the same session)
#   sprofile the same profile of vegas at its tuned setting, model-card sampling against greedy
#   gather   sparse_attention over random vs contiguous selections, splits 1-8, a dense kernel over
#            a compacted copy and the compaction's cost (scripts/device/probe_sparse_gather.py)
#   atests   the row argmax and the CUDA-graph path, compiled
#   argab    e2e greedy vanilla / stream / vegas with the chain's row-argmax kernel over bf16
#            logits, then with graphs.py's two lines put back to a float32 copy and torch.argmax
#   gprofile the profile of vegas at its tuned setting, greedy only
#   rtests   the qkv product with the rotary epilogue, the fused projections and layer kernels, and
#            the CUDA-graph path, compiled
#   rktests  the same without the CUDA-graph path (the kernels only)
#   selprobe the selection's two kernels over launch sizes (scripts/device/probe_selection.py)
#   selab    e2e greedy vanilla / stream / specextend / vegas with the engine's selection launch,
#            then with each SELECT_LAUNCH="BN,W,CHUNK,W ..." given
#   rlinear  qkv then the rotary kernel against the rotary as qkv's epilogue (bench linear)
#   rab      e2e greedy vanilla / stream / vegas with the rotary as qkv's epilogue, then with the
#            rotary kernel (--no-rotary-epilogue); rab-epilogue / rab-kernel run one of the two
#   sptests  sparse_attention's tests compiled (the packed program's bits against the per-KV-head
#            programs')
#   packab   e2e greedy vanilla / stream / vegas with the KV heads of a shared draft selection in
#            one program, then one program per KV head (--no-packed-sparse), each twice, alternated
#            (PACKAB="single-1 packed-1" for other runs)
#   fmab     e2e greedy vanilla / stream / vegas with a draft's split merge in its last split
#            (--sparse-fused-merge), then with the merge kernel, each twice, alternated
#   splitab  e2e greedy vanilla / stream / vegas with at least one tile of the index capacity a
#            split (--sparse-split-tiles 1), then the rule's two, each twice, alternated (in the
#            CUDA-graph path the capacity is the pool's width, so both run 12 splits at batch 64)
#   agree    the engine on the Triton kernels against the reference path (bench agreement): bf16,
#            24 prompts, every method and granularity; then float32, 20 prompts
#   tune8k   the three-step tune (TUNE8K_METHODS, default stream and vegas) at the long-input
#            workload near the model's 8K: prompts of 7,168-7,680 tokens of text (issue 5's
#            "batch 64 x ~8K"); kept at /root/tune8k.json for e2e8k
#   e2e8k    the full comparison at that workload, with /root/tune8k.json's settings merged over
#            E2E8K_TUNED's (scripts/device/merge_tune.py), or E2E8K_TUNED's alone
#   e2ebound e2e greedy vanilla / stream / vegas at the default long-input workload (its
#            bandwidth bound and each rate's share of it)
#   dprobe   the one-row call packed (one program for a request's KV heads) against a program per
#            KV head, with tiles, warps and splits, beside cuDNN SDPA (scripts/device/probe_decode_packed.py;
#            it needs commit b6ca0de's kernel restored, see its header)
#   vtests   verify_attention's tests and the CUDA-graph path, compiled
#   hints    verify_attention's K/V loads with cache / eviction hints (scripts/device/probe_kv_hints.py;
#            it needs commit f169a0f's kernel restored, see its header)
#   ahead    verify_attention loading block-table entries 1 or 2 tiles ahead, 2 and 3 stages
#            (scripts/device/probe_page_ahead.py)
#   paab     e2e greedy vanilla / stream / vegas with the plain decode step's page-ahead launch,
#            then without (--no-page-ahead), each twice, alternated (E2E_ARGS sets the workload)
#   ncu1     Nsight Compute's counters and warp stall reasons for the attention kernels at one row
#            (scripts/device/ncu_kernels.py --q-rows 1), into $OUT/ncu-1row.txt
#   profile  torch.profiler over three iterations of vegas (gamma 10), vanilla, vanilla with 16-step
#            chains: GPU kernels, host operators, and GPU-idle time charged to host phases
# Results go to $OUT/results, every log to $OUT/run.log; a table per stage is printed. E2E_ARGS adds
# options to the e2e stages (e.g. --tuned bench/results/tune-....json), KERNELS_ARGS to the kernels
# stage and TUNE_ARGS to tune8k.
set -uo pipefail
[ -f /root/vegas-env ] && . /root/vegas-env   # the model (stage.sh's call 2); stages without it run too
: "${VEGAS_DEVICE_MODEL:=}"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT/results"
step() { local name=$1 limit=$2; shift 2; echo "== $name" | tee -a "$OUT/run.log"; local t=$SECONDS
  timeout "$limit" "$@" > "$OUT/step.log" 2>&1; local rc=$?
  cat "$OUT/step.log" >> "$OUT/run.log"; echo "rc=$rc ${name} $((SECONDS - t))s" | tee -a "$OUT/steps.txt"
  grep -v '%|' "$OUT/step.log" | tail -n "${TAIL:-25}"; rm -f "$OUT/step.log"; }
E2E=(python3 -m vegas_core.bench e2e --model "$VEGAS_DEVICE_MODEL" --workload long-input --batch 64
     --out "$OUT/results")
# An e2e A/B, greedy vanilla / stream / vegas: `ab NAME LIMIT KIND FLAG VARIANTS...` runs each
# variant (KIND-1, other-2, ...: the part before "-" names it) into results/NAME-VARIANT, with FLAG
# where that part is KIND.
ab() { local name=$1 limit=$2 kind=$3 flag=$4 v f; shift 4
  for v in "$@"; do
    f=""; [ "${v%-*}" = "$kind" ] && f=$flag
    mkdir -p "$OUT/results/$name-$v"; TAIL=8 step "$name-$v" "$limit" "${E2E[@]}" --methods vanilla stream vegas \
      --sampling greedy --out "$OUT/results/$name-$v" $f ${E2E_ARGS:-}
  done; }
for stage in "$@"; do
  case $stage in
    tests) TAIL=30 step tests 400 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_sort.py tests/kernels/test_fused.py \
             tests/kernels/test_fused_linear.py tests/kernels/test_sparse_attention.py tests/kernels/test_sampling.py tests/vegas_core/test_graphs.py tests/kernels/test_verify_attention.py tests/kernels/test_select.py ;;
    ftests) TAIL=12 step ftests 300 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_fused.py \
             tests/kernels/test_fused_linear.py tests/kernels/test_sparse_attention.py tests/vegas_core/test_graphs.py ;;
    ktests) TAIL=6 step ktests 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_verify_attention.py \
             tests/kernels/test_sparse_attention.py ;;
    merge) mkdir -p "$OUT/results/merge"; TAIL=14 step merge 240 python3 -m vegas_core.bench kernels \
             --batch 64 --context 8192 --sweep-rows 8 --no-tune --merge-tune --out "$OUT/results/merge" ;;
    order) mkdir -p "$OUT/results/order"; TAIL=16 step order 300 python3 -m vegas_core.bench kernels \
             --batch 64 --context 8192 --sweep-rows 8 --no-tune --order-tune --out "$OUT/results/order" ;;
    layout) mkdir -p "$OUT/results/layout"; TAIL=60 step layout 300 python3 -m vegas_core.bench kernels \
             --batch 64 --context 8192 --sweep-rows 8 --no-tune --layout-sweep --out "$OUT/results/layout" ;;
    linear) mkdir -p "$OUT/results/linear"; TAIL=30 step linear 400 python3 -m vegas_core.bench linear \
             --sweep --out "$OUT/results/linear"; cp "$OUT"/results/linear/linear-*.json /root/linear-best.json ;;
    linearab) mkdir -p "$OUT/results/linear"; TAIL=20 step linearab 200 python3 -m vegas_core.bench linear \
             --ops qkv o_proj gate_up down_proj --out "$OUT/results/linear" ;;
    ab) variants=("cublas --fused-linear-rows 0 --no-pdl" "cublas-pdl --fused-linear-rows 0"
                  "fused-pdl --fused-linear-rows 128" "allfused-pdl --fused-linear-rows 4096")
        for v in "${variants[@]}"; do
          set -- $v; name=$1; shift
          mkdir -p "$OUT/results/ab-$name"; TAIL=12 step "ab-$name" 240 "${E2E[@]}" --methods vanilla stream vegas \
            --sampling greedy --out "$OUT/results/ab-$name" ${E2E_ARGS:-} "$@"
        done ;;
    stests) TAIL=12 step stests 420 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_select_fused.py \
             tests/kernels/test_select.py tests/kernels/test_fused.py tests/kernels/test_verify_attention.py tests/kernels/test_fused_linear.py \
             tests/vegas_core/test_graphs.py ;;
    qtests) TAIL=12 step qtests 400 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_sort.py \
             tests/kernels/test_select.py tests/kernels/test_fused.py tests/vegas_core/test_graphs.py ;;
    quest) mkdir -p "$OUT/results/quest"; TAIL=10 step quest 240 "${E2E[@]}" --methods vanilla quest \
             --sampling greedy --out "$OUT/results/quest" ${E2E_ARGS:-} ;;
    selk) mkdir -p "$OUT/results/selk"; TAIL=24 step selk 240 python3 -m vegas_core.bench kernels --batch 64 \
            --context 8192 --sweep-rows 8 --no-tune --out "$OUT/results/selk" ;;
    ab2) variants=("base:vanilla stream specextend vegas" "fused-select:vanilla stream specextend vegas:--fused-select"
                   "verify-pdl:vanilla stream vegas:--verify-pdl" "both:vanilla stream specextend vegas:--fused-select --verify-pdl")
        for v in "${variants[@]}"; do
          IFS=: read -r name methods flags <<< "$v"
          mkdir -p "$OUT/results/ab-$name"; TAIL=12 step "ab-$name" 240 "${E2E[@]}" --methods $methods \
            --sampling greedy --out "$OUT/results/ab-$name" ${E2E_ARGS:-} $flags
        done ;;
    select) TAIL=6 step select 120 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_select.py ;;
    smoke) mkdir -p "$OUT/results/smoke"; TAIL=16 step smoke 200 "${E2E[@]}" --methods vanilla vegas \
             --sampling greedy --gen-tokens 96 --out "$OUT/results/smoke" ;;
    smokeall) mkdir -p "$OUT/results/smoke"; TAIL=20 step smokeall 300 "${E2E[@]}" --sampling greedy \
             --gen-tokens 64 --out "$OUT/results/smoke" ;;
    eager) mkdir -p "$OUT/results/eager"; TAIL=16 step eager 200 "${E2E[@]}" --methods vanilla vegas \
             --sampling greedy --gen-tokens 96 --eager --out "$OUT/results/eager" ;;
    kernels) TAIL=40 step kernels 300 python3 -m vegas_core.bench kernels --batch 64 --context 8192 \
               --sweep-rows 2 4 8 12 16 --no-tune --out "$OUT/results" ${KERNELS_ARGS:-} ;;
    sparse) mkdir -p "$OUT/results/sparse"; TAIL=24 step sparse 400 python3 -m vegas_core.bench kernels \
              --shapes ${SHAPES:-smollm2 8b} --batch 64 --context 8192 --sweep-rows 8 --no-tune --sparse-tune \
              --out "$OUT/results/sparse" ;;
    sampling) TAIL=14 step sampling 200 python3 -m vegas_core.bench sampling --ways 4 --warps 8 16 --out "$OUT/results" ;;
    e2e) TAIL=22 step e2e 330 "${E2E[@]}" ${E2E_ARGS:-} ;;
    tune) TAIL=16 step tune 450 python3 -m vegas_core.bench tune --model "$VEGAS_DEVICE_MODEL" \
            --workload long-input --batch 64 --gen-tokens ${TUNE_TOKENS:-256} --sparsities 0.02 0.04 0.07 0.1 0.15 \
            --gammas 3 4 6 8 10 --large-gamma 10 --out "$OUT/results" ;;
    profile) for run in "vegas g10 --gamma 10" "vanilla ms8" "vanilla ms16 --multi-step 16"; do
               set -- $run; m=$1 name=$1-$2; shift 2
               timeout 150 python3 scripts/device/profile_step.py $m 64 6000 "$@" > "$OUT/profile-$name.txt" 2>&1
               echo "rc=$? profile $run" | tee -a "$OUT/steps.txt"; grep -v '%|' "$OUT/profile-$name.txt" | tail -14
             done ;;
    sprofile) for run in "vegas sampled --gamma 8 --sparsity 0.05 --temperature 0.2 --top-p 0.9" \
                         "vegas greedy --gamma 8 --sparsity 0.05"; do
               set -- $run; m=$1 name=$1-$2; shift 2
               timeout 150 python3 scripts/device/profile_step.py $m 64 6000 "$@" > "$OUT/profile-$name.txt" 2>&1
               echo "rc=$? profile $run" | tee -a "$OUT/steps.txt"; grep -v '%|' "$OUT/profile-$name.txt" | tail -16
             done ;;
    atests) TAIL=8 step atests 300 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_argmax.py \
             tests/vegas_core/test_graphs.py ;;
    argab) for v in kernel torch; do
             if [ $v = torch ]; then
               cp vegas_core/graphs.py /tmp/graphs.py.kept
               sed -i -e 's/float_logits=not greedy_chain)/float_logits=True)/' \
                 -e 's/nxt = argmax_rows(logits) if self.runner.kernels else logits.argmax(dim=-1)/nxt = logits.argmax(dim=-1)/' \
                 vegas_core/graphs.py
               [ "$(grep -c 'float_logits=True)\|nxt = logits.argmax(dim=-1)$' vegas_core/graphs.py)" = 2 ] \
                 || { echo "argab: the sed did not apply"; break; }
             fi
             mkdir -p "$OUT/results/argab-$v"; TAIL=8 step "argab-$v" 240 "${E2E[@]}" --methods vanilla stream vegas \
               --sampling greedy --out "$OUT/results/argab-$v" ${E2E_ARGS:-}
           done
           [ -f /tmp/graphs.py.kept ] && cp /tmp/graphs.py.kept vegas_core/graphs.py ;;
    gather) TAIL=30 step gather 200 env PYTHONPATH=".:${PYTHONPATH:-}" python3 scripts/device/probe_sparse_gather.py ;;
    gprofile) timeout 150 env PYTHONPATH=".:${PYTHONPATH:-}" python3 scripts/device/profile_step.py vegas 64 6000 \
                --gamma 8 --sparsity 0.05 > "$OUT/profile-vegas-greedy.txt" 2>&1
              echo "rc=$? gprofile" | tee -a "$OUT/steps.txt"; grep -v '%|' "$OUT/profile-vegas-greedy.txt" | tail -16 ;;
    rtests) TAIL=8 step rtests 300 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_qkv_rotary.py \
             tests/kernels/test_fused_linear.py tests/kernels/test_fused.py tests/vegas_core/test_graphs.py ;;
    rktests) TAIL=6 step rktests 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_qkv_rotary.py \
             tests/kernels/test_fused_linear.py ;;
    selprobe) TAIL=70 step selprobe 200 env PYTHONPATH=".:${PYTHONPATH:-}" python3 scripts/device/probe_selection.py ;;
    selab) for v in ${SELAB_FIRST:-engine} ${SELECT_LAUNCH:-}; do
             flag=""; [ $v = engine ] || flag="--select-launch $v"; d=selab-${v//,/-}
             mkdir -p "$OUT/results/$d"; TAIL=8 step "$d" 200 "${E2E[@]}" --methods vanilla stream specextend vegas \
               --sampling greedy --out "$OUT/results/$d" $flag ${E2E_ARGS:-}
           done ;;
    rlinear) mkdir -p "$OUT/results/linear"; TAIL=16 step rlinear 200 python3 -m vegas_core.bench linear \
             --ops qkv qkv_rotary --out "$OUT/results/linear" ;;
    rab|rab-epilogue|rab-kernel)
           [ $stage = rab ] && variants="epilogue kernel" || variants=${stage#rab-}
           ab rab 280 kernel --no-rotary-epilogue $variants ;;
    sptests) TAIL=6 step sptests 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_sparse_attention.py ;;
    packab) ab packab 200 single --no-packed-sparse ${PACKAB:-packed-1 single-1 packed-2 single-2} ;;
    fmab) ab fmab 200 fused --sparse-fused-merge fused-1 kernel-1 fused-2 kernel-2 ;;
    splitab) ab splitab 200 t1 "--sparse-split-tiles 1" t1-1 t2-1 t1-2 t2-2 ;;
    agree) mkdir -p "$OUT/results/agree-fp32"
           TAIL=20 step agree-bf16 330 python3 -m vegas_core.bench agreement --model "$VEGAS_DEVICE_MODEL" --out "$OUT/results"
           TAIL=12 step agree-fp32 200 python3 -m vegas_core.bench agreement --model "$VEGAS_DEVICE_MODEL" --dtype float32 \
             --prompts 20 --methods stream quest specextend vegas vegas-all --out "$OUT/results/agree-fp32" ;;
    tune8k) mkdir -p "$OUT/results/tune8k"; TAIL=16 step tune8k 520 python3 -m vegas_core.bench tune \
             --model "$VEGAS_DEVICE_MODEL" --workload long-input --batch 64 --gen-tokens 256 --prompt-tokens 7168 7680 \
             --sparsities 0.02 0.04 0.07 0.1 0.15 --gammas 3 4 6 8 10 12 --large-gamma 12 \
             --methods ${TUNE8K_METHODS:-stream vegas} --out "$OUT/results/tune8k" ${TUNE_ARGS:-}
            cp "$OUT"/results/tune8k/tune-*.json /root/tune8k.json ;;
    e2e8k) tuned=${E2E8K_TUNED:-bench/results/tune-2026-12-05-h200-run52-8k-merged.json}
           if [ -f /root/tune8k.json ]; then
             python3 scripts/device/merge_tune.py "$OUT/results/tune8k-merged.json" /root/tune8k.json "$tuned"
             tuned="$OUT/results/tune8k-merged.json"
           fi
           mkdir -p "$OUT/results/e2e8k"; TAIL=24 step e2e8k 470 "${E2E[@]}" --prompt-tokens 7168 7680 --tuned "$tuned" \
             --out "$OUT/results/e2e8k" ${E2E_ARGS:-} ;;
    e2ebound) mkdir -p "$OUT/results/bound"; TAIL=10 step e2ebound 150 "${E2E[@]}" --methods vanilla stream vegas \
             --sampling greedy --out "$OUT/results/bound" ${E2E_ARGS:-} ;;
    dprobe) TAIL=40 step dprobe 240 env PYTHONPATH=".:${PYTHONPATH:-}" python3 scripts/device/probe_decode_packed.py ;;
    hints) TAIL=30 step hints 300 env PYTHONPATH=".:${PYTHONPATH:-}" python3 scripts/device/probe_kv_hints.py ;;
    paab) ab paab 200 off --no-page-ahead ahead-1 off-1 ahead-2 off-2 ;;
    ahead) TAIL=40 step ahead 300 env PYTHONPATH=".:${PYTHONPATH:-}" python3 scripts/device/probe_page_ahead.py ;;
    ncu1) NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
          timeout 240 "$NCU" --profile-from-start off --clock-control none --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section SchedulerStats \
            --section WarpStateStats env PYTHONPATH=".:${PYTHONPATH:-}" python3 scripts/device/ncu_kernels.py \
            --q-rows 1 > "$OUT/ncu-1row.txt" 2>&1
          echo "rc=$? ncu1" | tee -a "$OUT/steps.txt"; grep -E "verify|Duration|Throughput|Stall|Warp Cycles|Registers|Occupancy|Issue" "$OUT/ncu-1row.txt" | head -40 ;;
    vtests) TAIL=6 step vtests 300 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_verify_attention.py \
             tests/vegas_core/test_graphs.py ;;
    *) echo "unknown stage $stage" ;;
  esac
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
