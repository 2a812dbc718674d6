# polytile — the two set-up commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CUDA_STAMP := $(VENV)/.installed-cuda

.PHONY: demo test test-all gpu-check lint bench-cpu clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# the CUDA driver bindings where an NVIDIA GPU is present: make demo then runs on the GPU
$(CUDA_STAMP): $(STAMP)
	if nvidia-smi -L >/dev/null 2>&1; then $(BIN)/python -m pip install -q -e '.[cuda]'; fi
	touch $(CUDA_STAMP)

demo: $(CUDA_STAMP)
	$(BIN)/python -m polytile.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not gpu" --timeout 900

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --timeout 900

gpu-check:
	bash scripts/gpu-check.sh

lint: $(STAMP)
	$(BIN)/ruff check polytile tests benchmarks

bench-cpu: $(STAMP)
	$(BIN)/python benchmarks/cpu_ops.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
