#!/usr/bin/env bash
# GPU run for the SASS schedule optimizer (issue 6): the GPU tests, then the benchmark, in
# about 10 minutes at most. Run from anywhere on the GPU host:  bash scripts/sass-gpu.sh
# Knobs (environment): SASS_MEASUREMENTS (GPU timings per method and kernel, default 32),
# SASS_METHODS (default ppo,greedy), SASS_KERNELS (default all ten), SASS_REPS (default 15).
# Needs: cuda-bindings, triton, numpy, pytest (on the host); pyelftools, gymnasium,
# farama-notifications, stable-baselines3, sb3-contrib, cloudpickle as wheels in ./.whl (installed
# to /tmp/site without an index); nvdisasm (CUDA toolkit); the CUDA C cubins from nvcc, or built
# beforehand with `python benchmarks/sass.py --build-only` and carried in benchmarks/kernels/build/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G ".whl/*.whl" > /dev/null; then  # wheels carried to a host without a package index
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 -c "import elftools, gymnasium, sb3_contrib" || { echo "missing pyelftools/gymnasium/sb3-contrib wheels in .whl" >&2; exit 2; }
# the disassembler: the pip wheel (one version everywhere) when installed, else the toolkit's
if [ -z "${POLYTILE_NVDISASM:-}" ] && ! python3 -c "from polytile.sass.disasm import find_nvdisasm; import sys; sys.exit('nvidia' not in find_nvdisasm())" 2>/dev/null; then
  if ! command -v nvdisasm > /dev/null; then
    for d in "${CUDA_HOME:-/usr/local/cuda}/bin" /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
      if [ -x "$d/nvdisasm" ]; then export POLYTILE_NVDISASM="$d/nvdisasm"; break; fi
    done
  fi
fi
python3 -c "from polytile.sass.disasm import find_nvdisasm; print('nvdisasm:', find_nvdisasm())"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

if python3 -c "from polytile.toolchain import find_nvcc; import sys; sys.exit(find_nvcc() is None)"; then
  python3 benchmarks/sass.py --build-only
fi

echo "== GPU tests"
timeout 200 python3 -m pytest -m gpu tests/sass -x -q -p no:cacheprovider

echo "== benchmark"
timeout 420 python3 benchmarks/sass.py --measurements "${SASS_MEASUREMENTS:-32}" \
  --methods "${SASS_METHODS:-ppo,greedy}" --reps "${SASS_REPS:-15}" --confirm 5 \
  ${SASS_KERNELS:+--kernels "$SASS_KERNELS"}
