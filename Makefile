# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.pactrain-installed

export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
# TensorFlow's C++ log: 2 drops its INFO/WARNING start-up lines (oneDNN, CUDA, CPU features, TensorRT)
# and keeps errors. scripts/test.sh and benchmarks/accuracy use 3 for PyTorch runs under horovodrun.
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test test-compat lint docs accuracy bench tta clean docker docker-test

$(STAMP): scripts/install.sh setup.py
	bash scripts/install.sh

install:
	bash scripts/install.sh

# Dense Horovod, Horovod with fp16 compression, then PacTrain, on an emulated 100 Mbit/s link per worker
# (root), else loopback. The table and picture go to demo-output/ (untracked); DEMO_ARGS=--record
# refreshes the committed record, reports/demo/.
demo: $(STAMP)
	$(PY) -m benchmarks.demo.demo $(DEMO_ARGS)

test: $(STAMP)
	bash scripts/test.sh

# The oldest supported stack (TF 2.16.2, numpy<2) in its own venv: unit tests and both frontends' multi-rank suites.
COMPAT_VENV := $(CURDIR)/.venv-compat
test-compat:
	VENV=$(COMPAT_VENV) TF_VERSION=2.16.2 bash scripts/install.sh
	VENV=$(COMPAT_VENV) TEST_SUITES="unit torch tensorflow" bash scripts/test.sh

accuracy: $(STAMP)
	$(PY) -m benchmarks.accuracy.accuracy

# Time to accuracy on emulated links (root): every method trains the image workload; TTA_ARGS=--quick for a sanity run.
tta: $(STAMP)
	$(PY) -m benchmarks tta $(TTA_ARGS)

# The benchmark on emulated links (root: network namespaces, tc); BENCH_ARGS=--quick for a short run.
bench: $(STAMP)
	$(PY) -m benchmarks $(BENCH_ARGS)

# The CPU image with podman (root): a Debian base made with debootstrap unless BASE_IMAGE names one,
# the host's pip configuration handed to the build read-only. FLAVOR=gpu builds docker/gpu. docker/README.md.
docker:
	bash scripts/docker_build.sh

# Two containers of the image on a podman network: the Gloo (horovodrun over ssh) and MPI jobs, then
# the same on a 100 Mbit/s link (tc in each container). Removes all it starts. docker/README.md.
docker-test: docker
	bash scripts/docker_test.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The documentation site (Sphinx, MyST Markdown pages, autodoc API reference) into docs/_build/html; warnings are errors.
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf build *.egg-info .pytest_cache .ruff_cache docs/_build demo-output
