# Thin front for the eagle3-trt CLI. Every target sets up .venv on first use.
#   make tiny-pairs [PAIRS="tiny tiny-qwen3 tiny-gpt-oss"]: retrain the embedded pairs (models/tiny: ~17 min on 2 cores)
#   make engine [MODEL=tiny|tiny-qwen3|tiny-gpt-oss|llama3.1-8b|llama3.3-70b|qwen3-8b|qwen3-32b|gpt-oss-20b|gpt-oss-120b] [TARGET=dir DRAFT=dir] [GPU=h100|h200|b200]
#               [GPUS=n] [TP=n] [QUANT=fp8|nvfp4|bf16|native] [QUANTIZE_DRAFT=1] [DRY_RUN=1] [OUT=dir]
#               [HELDOUT=prompts file: the build measures acceptance on it and prints the gate verdict]
#   make docs   the documentation site (mkdocs --strict, into .cache/site)
#   make test   lint, then the test suite (what CI runs); make lint: import contracts, ruff, mypy; make test-compat: the same on TensorRT-LLM 1.2's
#               library generation (transformers 4.57.3, ModelOpt 0.37)
#   make serve  [BUNDLE=engines/tiny-fp8-h100] [REPO=repos/eagle3] [RUNTIME=reference|trtllm] [FORCE=1: overwrite our models despite edits]
#               [HTTP_PORT=8000] [GRPC_PORT=8001] [METRICS_PORT=8002] [UNARY=1|only]: Triton on 127.0.0.1;
#               UNARY=1 adds a non-decoupled <name>_unary twin (HTTP /infer, gRPC ModelInfer), UNARY=only
#               makes the one model non-decoupled (upstream llmapi's default); make stop
#   make serve-dynamo [BUNDLE=dir] [WORKERS=2] [DYNAMO_PORT=8080] [WORKER_PORT_BASE=port]: NVIDIA Dynamo (OpenAI API); make status-dynamo, make stop
#   make bench-serving [PROMPTS=file] [CONCURRENCY=1,4,16,64] [OPENAI_URL=http://127.0.0.1:8080/v1]: rollout benchmark
#     against Triton, or with OPENAI_URL against an OpenAI endpoint (the Dynamo frontend of make serve-dynamo)
#   make bench-aiperf  [BUNDLE=dir] [DYNAMO=1]: eagle3-trt bench vs NVIDIA AIPerf (own Triton, or Dynamo with 2 workers; C=1,8)
#   make bench-overhead [BUNDLE=dir] [ROUNDS=9] [OVERHEAD_CONCURRENCY=1,8,32,64] [DYNAMO=1]: ITL and throughput through Triton (and Dynamo) vs the runtime called directly
#   make loop-demo     the traffic loop on CPU: serve with capture, measure, retrain, gate, deploy, measure again
PY      ?= python3
VENV    ?= .venv
MODEL   ?= tiny
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.eagle3-trt-installed
# NVIDIA Dynamo (optional extra [dynamo]; make test and make serve-dynamo install it). ai-dynamo goes in with
# --no-deps: on Python >= 3.11 it requires aisimulate, a stub that downloads from an unreachable host.
DYNAMO_STAMP := $(VENV)/.eagle3-trt-dynamo
DYNAMO_VERSION ?= 1.6.1
TORCH_CPU_VERSION ?= 2.13.0
# The peer corpus' producers (tests/test_peer_heads.py), installed --no-deps into .venv and .venv-compat:
# their own pins (numpy>=2, transformers>=5, torch 2.11, sglang) would replace this environment's. Their light
# requirements are in pyproject's [test] extra.
PEER_PKGS ?= speculators==0.9.0 specforge==0.2.0 hs-connectors==0.9.0

ENGINE_ARGS := --model $(MODEL) \
  $(if $(TARGET),--target $(TARGET)) $(if $(DRAFT),--draft $(DRAFT)) \
  $(if $(GPU),--target-gpu $(GPU)) $(if $(GPUS),--gpus $(GPUS)) $(if $(TP),--tp $(TP)) $(if $(QUANT),--quant $(QUANT)) \
  $(if $(filter 1 yes true,$(QUANTIZE_DRAFT)),--quantize-draft) \
  $(if $(filter 1 yes true,$(DRY_RUN)),--dry-run) $(if $(OUT),-o $(OUT)) \
  $(if $(filter 1 yes true,$(FORCE)),--force) $(if $(HELDOUT),--heldout-prompts $(HELDOUT))

.PHONY: setup engine test bench clean help
help:
	@sed -n '/^[^#]/q;p' Makefile

setup: $(STAMP)

# A torch that is already importable (TensorRT-LLM containers pin their own build) is reused
# through --system-site-packages and pinned so pip never replaces it; otherwise the CPU build.
$(STAMP): pyproject.toml Makefile
	@set -e; \
	if [ ! -x $(BIN)/python ]; then \
	  if $(PY) -c "import torch" >/dev/null 2>&1; then \
	    echo "setup: reusing the installed torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	    $(PY) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PY) -m venv $(VENV); \
	  fi; \
	fi; \
	if ! $(BIN)/python -c "import torch" >/dev/null 2>&1; then \
	  echo "setup: installing torch==$(TORCH_CPU_VERSION) (CPU build)"; \
	  $(BIN)/pip install -q torch==$(TORCH_CPU_VERSION); \
	fi; \
	$(BIN)/python -W ignore -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/constraints.txt; \
	echo "setup: installing eagle3-trt and its dependencies (torch pinned: $$(cat $(VENV)/constraints.txt))"; \
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e '.[triton,test,docs]'; \
	$(BIN)/pip install -q -c $(VENV)/constraints.txt --no-deps $(PEER_PKGS); \
	touch $(STAMP)

engine: $(STAMP)
	$(BIN)/eagle3-trt engine $(ENGINE_ARGS)

# Rebuild the embedded pairs from the Python standard library, seeded (eagle3_trt/testing/make_tiny_pair.py):
# models/tiny in ~17 min on 2 cores (one torch thread; figures, seeds and the tolerance a rebuild is held to in
# models/tiny/MODEL_CARD.md). PAIRS="tiny tiny-qwen3 tiny-gpt-oss" also remakes the small ones (~2 min each).
PAIRS ?= tiny
.PHONY: tiny-pairs
tiny-pairs: $(STAMP)
	@set -e; for p in $(PAIRS); do \
	  case $$p in tiny) fam=llama;; tiny-qwen3) fam=qwen3;; tiny-gpt-oss) fam=gpt-oss;; \
	    *) echo "tiny-pairs: unknown pair '$$p' (PAIRS: tiny, tiny-qwen3, tiny-gpt-oss)" >&2; exit 2;; esac; \
	  OMP_NUM_THREADS=1 $(BIN)/python -m eagle3_trt.testing.make_tiny_pair --family $$fam -o models/$$p --overwrite; \
	done

# Installed packages may register global pytest plugins (ai-dynamo's drop test_triton_* files): autoloading
# is off and the suite names its own plugins in pyproject's addopts; its guard fails the run on any lost test.
# Two pytest-xdist workers, one test file each at a time (module fixtures start servers once): the suite
# waits on servers and subprocesses much of the time, so two workers on 2 cores take ~40% off its wall time.
# PYTEST_XDIST= runs it in one process.
PYTEST_XDIST ?= -p xdist.plugin -n 2 --dist loadfile --durations=25
test: lint $(DYNAMO_STAMP)
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS)

# The command blocks of the README and of every docs/ page, run on the tiny pairs (tests/test_readme_commands.py;
# also part of make test).
.PHONY: docs-check
docs-check: $(DYNAMO_STAMP)
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -q tests/test_readme_commands.py

# The documentation site (docs/, mkdocs.yml) into .cache/site; --strict: a broken link, a page missing
# from the nav or a command the generated reference cannot load fails (tests/test_docs_site.py runs
# the same build in make test). make docs-serve: the site on http://127.0.0.1:8040 while editing.
.PHONY: docs docs-serve
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict -a 127.0.0.1:8040

# Static checks, from the repository root on the checkout as it is: import-linter layer contracts,
# ruff (lint + format check) and mypy (strict on the pure layers, see pyproject). make test runs them first.
.PHONY: lint
lint: $(STAMP)
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --check --no-cache .
	$(BIN)/python -m mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_engine.py

# The library generation TensorRT-LLM 1.2 containers ship (transformers 4.57, ModelOpt 0.37), on
# this machine's torch: catches API drift (cache classes, exporter probes, config fields) on a
# plain machine. Where .venv reuses a system torch (a container), .venv-compat reuses it too.
COMPAT_VENV ?= .venv-compat
COMPAT_PINS ?= transformers==4.57.3 nvidia-modelopt==0.37.0
COMPAT_STAMP := $(COMPAT_VENV)/.eagle3-trt-installed
$(COMPAT_STAMP): pyproject.toml Makefile $(STAMP)
	@set -e; \
	if [ ! -x $(COMPAT_VENV)/bin/python ]; then \
	  if grep -q "include-system-site-packages = true" $(VENV)/pyvenv.cfg; then \
	    $(PY) -m venv --system-site-packages $(COMPAT_VENV); \
	  else \
	    $(PY) -m venv $(COMPAT_VENV); \
	  fi; \
	fi; \
	if ! $(COMPAT_VENV)/bin/python -c "import torch" >/dev/null 2>&1; then \
	  $(COMPAT_VENV)/bin/pip install -q "$$(cat $(VENV)/constraints.txt)"; \
	fi; \
	echo "test-compat: installing $(COMPAT_PINS) with $$(cat $(VENV)/constraints.txt)"; \
	$(COMPAT_VENV)/bin/pip install -q -c $(VENV)/constraints.txt -e '.[triton,test]' $(COMPAT_PINS); \
	$(COMPAT_VENV)/bin/pip install -q -c $(VENV)/constraints.txt --no-deps $(PEER_PKGS); \
	touch $(COMPAT_STAMP)

.PHONY: test-compat
test-compat: $(COMPAT_STAMP)
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(COMPAT_VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_XDIST) $(PYTEST_ARGS)

clean:
	rm -rf engines .pytest_cache

# --- Triton serving (reference runtime on CPU, TensorRT-LLM in its containers) ---
TINY_BUNDLE  := engines/tiny-fp8-h100
BUNDLE       ?= $(TINY_BUNDLE)
REPO         ?= repos/eagle3
RUNTIME      ?= reference
HTTP_PORT    ?= 8000
GRPC_PORT    ?= 8001
METRICS_PORT ?= 8002
TORCH_THREADS ?=
PROMPTS      ?= convert/data/calib_prompts.jsonl
CONCURRENCY  ?= 1,4,16,64

.PHONY: serve stop bench-serving

serve: $(STAMP)
	@if [ ! -f "$(BUNDLE)/manifest.json" ]; then \
	  if [ "$(BUNDLE)" = "$(TINY_BUNDLE)" ]; then \
	    $(BIN)/eagle3-trt engine --model tiny -o $(BUNDLE); \
	  else \
	    echo "serve: $(BUNDLE) is not an engine bundle (build one with make engine)"; exit 2; \
	  fi; \
	fi
	@# no --force: package adds or updates only its own models, keeps edits it did not make (it names
	@# the file and stops), and refuses a repository a running server has loaded; FORCE=1 overwrites ours
	$(BIN)/eagle3-trt package $(BUNDLE) -o $(REPO) $(if $(filter 1 yes true,$(FORCE)),--force) --runtime $(RUNTIME) \
	  $(if $(TORCH_THREADS),--torch-threads $(TORCH_THREADS)) \
	  $(if $(filter 1,$(UNARY)),--with-unary) $(if $(filter only,$(UNARY)),--no-decoupled)
	$(BIN)/eagle3-trt serve $(REPO) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

stop: $(STAMP)
	@rc=0; $(BIN)/eagle3-trt stop || rc=$$?; $(BIN)/eagle3-trt stop-dynamo || rc=$$?; exit $$rc

bench-serving: $(STAMP)
	$(BIN)/eagle3-trt bench --prompts $(PROMPTS) --concurrency $(CONCURRENCY) $(if $(OPENAI_URL),--openai-url $(OPENAI_URL))

# --- NVIDIA Dynamo: OpenAI frontend + WORKERS reference-runtime workers on 127.0.0.1 (file discovery) ---
WORKERS     ?= 2
DYNAMO_PORT ?= 8080
.PHONY: serve-dynamo status-dynamo
$(DYNAMO_STAMP): $(STAMP)
	@echo "setup: installing NVIDIA Dynamo $(DYNAMO_VERSION) (the [dynamo] extra, then ai-dynamo --no-deps)"
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e '.[triton,test,docs,dynamo]'
	$(BIN)/pip install -q --no-deps 'ai-dynamo==$(DYNAMO_VERSION)'
	touch $(DYNAMO_STAMP)

serve-dynamo: $(DYNAMO_STAMP)
	@if [ ! -f "$(BUNDLE)/manifest.json" ] && [ "$(BUNDLE)" = "$(TINY_BUNDLE)" ]; then \
	  $(BIN)/eagle3-trt engine --model tiny -o $(BUNDLE); \
	fi
	$(BIN)/eagle3-trt serve-dynamo $(BUNDLE) --workers $(WORKERS) --http-port $(DYNAMO_PORT) \
	  $(if $(TORCH_THREADS),--torch-threads $(TORCH_THREADS)) $(if $(WORKER_PORT_BASE),--worker-port-base $(WORKER_PORT_BASE))

status-dynamo: $(STAMP)
	$(BIN)/eagle3-trt status-dynamo

# --- Cross-checks (slow, not part of make test) ---
# AIPerf pins its own rich/pillow/psutil, so it lives in its own environment (also: pip install 'eagle3-trt[bench]').
AIPERF_VENV ?= .venv-aiperf
AIPERF_SPEC ?= aiperf==0.13.0
ROUNDS      ?= 9
OVERHEAD_CONCURRENCY ?= 1
BENCH_BUNDLE_ARG = $(if $(filter-out $(TINY_BUNDLE),$(BUNDLE)),--bundle $(BUNDLE))

.PHONY: bench-aiperf bench-overhead
$(AIPERF_VENV)/bin/aiperf:
	$(PY) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install -q '$(AIPERF_SPEC)'

bench-aiperf: $(STAMP) $(AIPERF_VENV)/bin/aiperf $(if $(filter 1,$(DYNAMO)),$(DYNAMO_STAMP))
	$(BIN)/python benchmarks/compare_aiperf.py --aiperf $(AIPERF_VENV)/bin/aiperf --concurrency 1,8 --rounds 2 $(BENCH_BUNDLE_ARG) \
	  $(if $(filter 1,$(DYNAMO)),--dynamo)

bench-overhead: $(STAMP) $(if $(filter 1,$(DYNAMO)),$(DYNAMO_STAMP))
	$(BIN)/python benchmarks/bench_serving_overhead.py --rounds $(ROUNDS) --concurrency $(OVERHEAD_CONCURRENCY) $(BENCH_BUNDLE_ARG) $(if $(filter 1,$(DYNAMO)),--dynamo)

# --- The traffic loop (issue 23): serve with capture, measure, retrain, gate, deploy, measure again ---
# CPU only, a few minutes; work files in loop-demo/ (replaced on each run); ports 8100-8102.
.PHONY: loop-demo
loop-demo: $(STAMP)
	$(BIN)/python examples/loop_demo.py $(LOOP_ARGS)
