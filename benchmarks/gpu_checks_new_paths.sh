#!/usr/bin/env bash
# On a lent Hopper, after gpu_run.sh's setup: this session's new kernel paths compiled and gated on the GPU
# (post-norm residuals in the norm kernels, group norms, squeeze-excite's gate read by conv2d_nhwc, float32-angle rotary, the squared-ReLU GEMM epilogue,
# attention with values wider than keys and MPT's float32-scored attention), then a short whole-model tune of
# Gemma 2's widths (post-norm residual RMSNorms, soft-capped attention) beside torch.
#   device run: bash benchmarks/gpu_run.sh bash benchmarks/gpu_checks_new_paths.sh      carry [".whl"]
# the group norm kernels (groupnorm_looped, groupnorm_split) in the gate and timed on Stable Diffusion's shapes,
# GATE_ONLY=1 stops after the gate checks and that suite (about 330 s with the setup).
set -uo pipefail
T=$(python3 -c "import torch; print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
LOG=$OUT/steps.log
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_memory.py -k "variant_matches_reference and (norm or rotary)" \
  > /tmp/memory.log 2>&1; echo "memory kernels rc $?"; tail -3 /tmp/memory.log; cat /tmp/memory.log >> "$LOG"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_matrix.py -k "(variant_matches_reference and (attention_flash or attention_splitkv or gemm_tiled or gemm_wgmma or conv2d_nhwc)) or gated_tap_rows" \
  > /tmp/matrix.log 2>&1; echo "matrix kernels rc $?"; tail -3 /tmp/matrix.log; cat /tmp/matrix.log >> "$LOG"
# the groupnorm kernels beside F.group_norm + SiLU and torch.compile on Stable Diffusion's shapes
timeout 150 python3 benchmarks/ops/bench_ops.py --suite groupnorm --target $T --trials 10 --case-seconds 20 \
  --budget-seconds 110 --out "$OUT/ops-groupnorm.json" > /tmp/gn.log 2>&1
echo "groupnorm rc $?"; cat /tmp/gn.log >> "$LOG"; grep " portkern=" /tmp/gn.log
[ "${GATE_ONLY:-0}" = 1 ] && exit 0
timeout 190 python3 benchmarks/models/gpu_models.py --models gemma2 --target $T --time-budget 60 --rounds 2 \
  --compile-workers 8 --compile-modes default --out "$OUT/gemma2.json" > /tmp/model.log 2>&1
echo "gemma2 rc $?"; grep -v "^W12\|dynamo" /tmp/model.log >> "$LOG"; grep "^gemma2:" /tmp/model.log
rm -rf "$OUT/gemma2.pkpack"
