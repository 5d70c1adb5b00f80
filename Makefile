# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.pactrain-installed
NP      ?= 2

export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: install demo test lint accuracy bench clean

$(STAMP): scripts/install.sh setup.py
	bash scripts/install.sh

install:
	bash scripts/install.sh

demo: $(STAMP)
	$(VENV)/bin/horovodrun -np $(NP) -H localhost:$(NP) --gloo $(PY) examples/pytorch_demo.py

test: $(STAMP)
	bash scripts/test.sh

accuracy: $(STAMP)
	$(PY) scripts/accuracy.py

# The benchmark on emulated links (root: network namespaces, tc); BENCH_ARGS=--quick for a short run.
bench: $(STAMP)
	$(PY) -m pactrain_hvd.bench $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf build *.egg-info .pytest_cache .ruff_cache
