#!/usr/bin/env bash
# The GPU run, in one go: GPU tests (pytest -m gpu), the GPU benchmarks, and a short table last.
# On the GPU host (no package index): carry .whl and .tools and run
#   source .tools/offline-install.sh; bash scripts/gpu-check.sh
# Options (environment): GPU_CHECK_QUICK=1 for smaller benchmark sizes; GPU_CHECK_SKIP=tests,sass,...
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
OUT_DIR="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT_DIR"
skip="${GPU_CHECK_SKIP:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, islpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'islpy', islpy.__version__)"

if [[ ",$skip," != *",tests,"* ]]; then
  echo "== pytest -m gpu"
  timeout 500 python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 tests/cuda tests/core 2>&1 | tee "$OUT_DIR/pytest-gpu.log" | tail -25
fi
if [[ ",$skip," != *",ops,"* ]]; then
  echo "== benchmarks/gpu_ops.py"
  timeout 400 python3 benchmarks/gpu_ops.py ${GPU_CHECK_QUICK:+--quick} 2>&1 | tee "$OUT_DIR/gpu_ops.log" | tail -12
fi
if [[ ",$skip," != *",sass,"* && -f scripts/sass-gpu.sh ]]; then
  echo "== SASS optimizer"
  bash scripts/sass-gpu.sh 2>&1 | tee "$OUT_DIR/sass.log" | tail -14
fi
cp benchmarks/results/*.json "$OUT_DIR"/ 2>/dev/null || true
echo "== summary"
grep -E "passed|failed" "$OUT_DIR/pytest-gpu.log" 2>/dev/null | tail -1
tail -9 "$OUT_DIR/gpu_ops.log" 2>/dev/null
tail -9 "$OUT_DIR/sass.log" 2>/dev/null
