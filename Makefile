# The two commands a newcomer needs: `make demo` and `make test`. Each creates .venv if needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# `make image`: the services' image with docker or podman (ENGINE=... to choose). EXTRAS=sim adds
# the simulator, the partkeeper-sim distribution in ./sim (what compose/ runs); IMAGE names the result, e.g. IMAGE=registry/partkeeper:0.1.0.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
ENGINE ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)
EXTRAS ?=
IMAGE ?= partkeeper:$(VERSION)$(if $(EXTRAS),-$(EXTRAS))
# Extra flags for the engine's build, e.g. BUILD_FLAGS='--ulimit nofile=4096:4096' where the
# engine's default limits cannot be set (tests/tests_support/containers.py).
BUILD_FLAGS ?=

.PHONY: demo test lint typecheck bench image clean

# Both distributions, editable: the node agent (.) and the simulator (./sim, partkeeper-sim), which
# `partkeeper up`, `partkeeper sim`, PK_DRIVER=sim and the tests need (docs/architecture.md).
$(STAMP): pyproject.toml sim/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./sim
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/partkeeper up --demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/hadolint Dockerfile

# mypy over schemas/, partkeeper/, services/, sim/partkeeper_sim/, tests/ and bench/: strict on the schemas,
# the claims store, the bus and the services' pure decision modules, normal elsewhere
# (pyproject.toml [tool.mypy]).
typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m bench

image:
	@if [ -z "$(ENGINE)" ]; then \
	  echo "make image: neither docker nor podman is installed; install one, or set ENGINE" >&2; \
	  exit 2; fi
	@if ! "$(ENGINE)" info >/dev/null 2>&1; then \
	  echo "make image: $(ENGINE) is installed but its daemon does not answer" \
	       "($(ENGINE) info failed); start it, or use ENGINE=podman (daemonless)" >&2; \
	  exit 2; fi
	"$(ENGINE)" build $(BUILD_FLAGS) --build-arg EXTRAS=$(EXTRAS) --build-arg VERSION=$(VERSION) \
	  -t $(IMAGE) -f Dockerfile .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
