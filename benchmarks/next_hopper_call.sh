#!/usr/bin/env bash
# The next lent Hopper call, one command inside the 10-minute limit (benchmarks/README.md, "next call"):
#   bash benchmarks/gpu_wheels.sh                      # once per checkout, here
#   device run: bash benchmarks/gpu_run.sh bash benchmarks/next_hopper_call.sh     carry [".whl"]
# On an H200: the FFN-epilogue grid and gemm_wgmma's table (neither has run on an H200), written
# under benchmarks/results/ with their final names (and copied to $OUT), the h200 priors rebuilt
# from them beside the tables h200.jsonl already names, then the tuned suites seeded by those
# priors. On an H100 (run's kinds serve for each other): the models of gpu_models.py in $MODELS, each
# as model[:tuning seconds]
# (default: Gemma 2's and GPT-J's widths, soft-capped attention logits, columns rotated in pairs
# and float32-scored float16 attention, none timed on a GPU yet, 60 s each, and transformers'
# MobileNetV2, channels-last end to end since its Pads fold into its convs, 45 s; llama-decode:90 is
# the LLaMA's decoding step), then, with PROBE=1, the in-sequence probe of BERT's FFN GEMM. Each step has its own timeout, so one
# that hangs costs only itself. What comes back (at most 8 files): device.txt, the grid, the table,
# the suites', the models' or the probes' JSON, and every step's output in steps.log; the priors
# are rebuilt here the same way from the grid and table. With little device time left:
# H200_ONLY=1 stops at once on an H100 (the call costs its start only), SUITES_ONLY=1 runs an H200's
# suites alone (with the priors it has; about 330 s at most), H200_SUITES names which (all three).
set -uo pipefail
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name())")
case "$GPU" in *H200*) T=h200;; *) T=h100;; esac
DAY=$(date -u +%Y-%m-%d)
R=benchmarks/results
echo "== $GPU: target $T"
[ "${H200_ONLY:-0}" = 1 ] && [ "$T" != h200 ] && { echo "H200_ONLY: not an H200, nothing run"; exit 0; }
LOG=$OUT/steps.log
keep() { cp "$1" "$OUT/"; }
if [ "$T" = h200 ] && [ "${SUITES_ONLY:-0}" != 1 ]; then
  GRID=$R/h200-grid-gemm-epilogue-$DAY.json
  TABLE=$R/h200-table-wgmma-$DAY.json
  timeout 110 python3 benchmarks/ops/grid_matrix.py --variants gemm_pingpong,gemm_tma,gemm_wgmma --configs 6 \
    --target h200 --ops gemm:4096x3072x768:bias+gelu,gemm:4096x3072x768:bias+gelu_tanh,gemm:4096x768x3072:bias+residual,gemm:4096x11008x4096:silu \
    --out "$GRID" > /tmp/grid.log 2>&1; echo "grid rc $?"; cat /tmp/grid.log >> "$LOG"; grep -A6 "^op " /tmp/grid.log; keep "$GRID"
  timeout 170 python3 benchmarks/search/gpu_table.py --target h200 \
    --shapes 4096x768x768,4096x3072x768,4096x768x3072,4096x4096x4096,4096x11008x4096 \
    --subspace "gemm_wgmma:BLOCK_M=128/192;BLOCK_N=64/128/256;BLOCK_K=32/64/128;GROUP_M=1/8;num_warps=4/8;num_stages=2/3/4/5" \
    --budget-seconds 140 --out "$TABLE" > /tmp/table.log 2>&1; echo "table rc $?"; cat /tmp/table.log >> "$LOG"; tail -8 /tmp/table.log; keep "$TABLE"
  TABLES=$(python3 -c "import json; print(' '.join(sorted({'--table ' + json.loads(l)['evidence'] for l in open('portkern/hwprofiles/priors/h200.jsonl')} - {'--table $GRID', '--table $TABLE'})))")
  python3 -m portkern.priors $TABLES --table "$GRID" --table "$TABLE" --top 3 --out portkern/hwprofiles/priors/h200.jsonl
fi
suite() {  # name, trials, case seconds, budget seconds
  timeout $(($4 + 30)) python3 benchmarks/ops/bench_ops.py --suite "$1" --priors --target $T --trials "$2" \
    --case-seconds "$3" --budget-seconds "$4" --out "$OUT/ops-$1.json" > /tmp/ops.log 2>&1
  echo "$1 rc $?"; cat /tmp/ops.log >> "$LOG"; grep " portkern=" /tmp/ops.log
}
if [ "$T" = h200 ]; then
  for name in ${H200_SUITES:-gemm-epilogue attention gemm}; do
    case $name in gemm-epilogue) suite $name 8 30 60;; *) suite $name 12 35 90;; esac
  done
else  # the H100 ran the newest attention paths through the gate and PACK_GQA's A/B on 2026-12-07 22:11
  # (h100-next-call-2026-12-07-gate-pack-gqa.log); the models there died of the worker bug fixed in 270af8e
  for entry in ${MODELS:-gemma2:60 mobilenet-v2:45 gptj:60}; do  # model[:tuning seconds, 60 if not given]
    model=${entry%%:*}; budget=60; [ "$entry" != "$model" ] && budget=${entry#*:}
    timeout $((budget + 130)) python3 benchmarks/models/gpu_models.py --models $model --target h100 \
      --time-budget $budget --rounds 2 \
      --compile-workers 8 --compile-modes default --out "$OUT/$model.json" > /tmp/model.log 2>&1
    echo "$model rc $?"; grep -v "^W12\|dynamo" /tmp/model.log >> "$LOG"; grep "^$model:" /tmp/model.log
    rm -rf "$OUT/$model.pkpack"
  done
  if [ "${PROBE:-0}" = 1 ]; then
    # BERT's FFN picks with each layer's own buffers (model_buffers): gemm_pingpong's in-model loss, not
    # reproduced on 2026-12-07 (37.0 vs 38.2 us, h100-in-sequence-probe-bert-ffn-2026-12-07)
    timeout 120 python3 benchmarks/ops/in_sequence_probe.py --suite gemm-epilogue --filter bert --target h100 --rounds 3 \
      --choices '[["gemm_pingpong", {"BLOCK_K": 64, "BLOCK_M": 128, "BLOCK_N": 128, "GROUP_M": 8, "STAGES": 4}], ["gemm_tma", {"BLOCK_K": 64, "BLOCK_M": 128, "BLOCK_N": 256, "FLATTEN": true, "GROUP_M": 8, "HALF_TAIL": false, "NUM_SMS": 132, "TMA_STORE": true, "num_stages": 3, "num_warps": 8}]]' \
      --out "$OUT/probe.json" > /tmp/probe.log 2>&1
    echo "probe rc $?"; cat /tmp/probe.log >> "$LOG"; grep "harness=" /tmp/probe.log
  fi
fi
