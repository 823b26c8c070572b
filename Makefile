# Tether: `make demo` sets everything up and trains the default job; `make test` sets everything up
# and runs the checks. Both build a project-local virtual environment in .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build. pip installs the CPU build where
# its configuration finds one (a local wheel on the project's machines); elsewhere name torch's CPU
# index: make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH := torch==2.13.0
TORCH_INDEX ?=
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: demo test test-all install dev data lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH)
	$(BIN)/python -m pip install -q numpy
	$(BIN)/python -m pip install -q -e .
	touch $@

# The mpi extra (mpi4py + MPICH) and the tensorboard extra come with the dev tools, so `make test`
# and CI run the MPI transport's and the TensorBoard log's tests; `make demo` needs none of it.
$(VENV)/.dev-installed: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[dev,mpi,tensorboard]'
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed

# Fashion-MNIST comes from Debian's dataset-fashion-mnist package; nothing is downloaded at run time.
data:
	@if [ ! -e $(FMNIST) ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "installing dataset-fashion-mnist (Debian package)"; \
	    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
	      || echo "warning: could not install dataset-fashion-mnist; pass --data-dir to tether"; \
	  else \
	    echo "note: Fashion-MNIST not found; run 'sudo apt-get install dataset-fashion-mnist' or pass --data-dir"; \
	  fi; \
	fi

demo: install data
	$(BIN)/tether train

lint: dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy

# `make test` leaves out the tests marked slow (pyproject's addopts: long end-to-end runs whose
# features faster tests also check); `make test-all` runs them too.
test: dev data lint
	$(BIN)/pytest -q

test-all: dev data lint
	$(BIN)/pytest -q -m ""

clean:
	rm -rf $(VENV) runs .mypy_cache .ruff_cache .pytest_cache
