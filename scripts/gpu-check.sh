#!/usr/bin/env bash
# The GPU run, in one go: GPU tests (pytest -m gpu), the GPU benchmarks, and a short table last.
# On the GPU host (no package index): carry .whl and .tools and run
#   source .tools/offline-install.sh; bash scripts/gpu-check.sh
# Parts (run in this order): tests, ops (benchmarks/gpu_ops.py), pipelining (benchmarks/pipelining.py),
# alcop (benchmarks/alcop_search.py), sass (scripts/sass-gpu.sh).
# Options (environment): GPU_CHECK_ONLY=tests,pipelining runs only those parts; GPU_CHECK_SKIP=sass,...
# skips parts; GPU_CHECK_QUICK=1 for smaller benchmark sizes. Logs and JSON records go to $OUT (the
# device tool's output folder) or /tmp/gpu-check.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
OUT_DIR="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT_DIR"
START_MARK="$(mktemp)"  # the JSON records written by this run are newer than this file
skip="${GPU_CHECK_SKIP:-}"
only="${GPU_CHECK_ONLY:-}"
quick="${GPU_CHECK_QUICK:+--quick}"
want() { [[ ",$skip," != *",$1,"* ]] && { [[ -z "$only" ]] || [[ ",$only," == *",$1,"* ]]; }; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, islpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'islpy', islpy.__version__)"

if want tests; then
  echo "== pytest -m gpu"
  timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/cuda tests/core tests/tune 2>&1 \
    | tee "$OUT_DIR/pytest-gpu.log" | tail -25
fi
if want ops; then
  echo "== benchmarks/gpu_ops.py"
  timeout 300 python3 benchmarks/gpu_ops.py $quick 2>&1 | tee "$OUT_DIR/gpu_ops.log" | tail -12
fi
if want pipelining; then
  echo "== benchmarks/pipelining.py"
  timeout 420 python3 benchmarks/pipelining.py $quick 2>&1 | tee "$OUT_DIR/pipelining.log" | tail -22
fi
if want alcop && [[ -f benchmarks/alcop_search.py ]]; then
  echo "== benchmarks/alcop_search.py"
  timeout 420 python3 benchmarks/alcop_search.py $quick 2>&1 | tee "$OUT_DIR/alcop.log" | tail -20
fi
if want sass && [[ -f scripts/sass-gpu.sh ]]; then
  echo "== SASS optimizer"
  bash scripts/sass-gpu.sh 2>&1 | tee "$OUT_DIR/sass.log" | tail -14
fi
find benchmarks/results -name '*.json' -newer "$START_MARK" -exec cp {} "$OUT_DIR"/ \; 2>/dev/null || true
echo "== summary"
[[ -f "$OUT_DIR/pytest-gpu.log" ]] && grep -E "passed|failed" "$OUT_DIR/pytest-gpu.log" | tail -1
[[ -f "$OUT_DIR/gpu_ops.log" ]] && tail -11 "$OUT_DIR/gpu_ops.log"
[[ -f "$OUT_DIR/pipelining.log" ]] && grep -A30 "^Tensor cores and pipelining" "$OUT_DIR/pipelining.log"
[[ -f "$OUT_DIR/alcop.log" ]] && tail -12 "$OUT_DIR/alcop.log"
[[ -f "$OUT_DIR/sass.log" ]] && tail -9 "$OUT_DIR/sass.log"
exit 0
