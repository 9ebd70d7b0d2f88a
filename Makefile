# vgpud — the two commands that matter: `make demo` and `make test`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export PIP_CACHE_DIR := $(CURDIR)/.cache/pip

.PHONY: setup build image kube chart-crds chart-docs prometheus cuda-clients node-deps node cluster cluster-test test unit lint protos check-protos demo bench fuzz soak clean

setup:  ## venv with vgpud and its dev dependencies (idempotent, cached)
	@./hack/setup-venv.sh

build: setup  ## C helpers (fake NVML, libvgpu) into build/
	@for d in csrc/*/; do [ -f "$$d/Makefile" ] || continue; $(MAKE) --no-print-directory -C "$$d" OUT=$(CURDIR)/build || exit 1; done

image: build  ## vgpud's OCI image (a tarball for `ctr images import`) into build/image; its name and path in build/image/image.env
	@./hack/build-image.sh

kube:  ## etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, crictl, helm into ~/.cache/vgpud (idempotent, cached)
	@./hack/install-kube.sh

chart-crds:  ## cert-manager, ServiceMonitor and PrometheusRule CRDs (from their Go modules) for the chart's server-side dry run
	@./hack/fetch-chart-crds.sh

chart-docs: setup  ## write the values table of helm/vgpud/README.md from values.yaml's `# --` comments (hack/chart-values-table.py; a test fails while it is stale)
	@$(PY) hack/chart-values-table.py

prometheus:  ## Prometheus and promtool built from their Go module into ~/.cache/vgpud
	@./hack/install-prometheus.sh

cuda-clients:  ## NVIDIA's Python driver-API clients (cuda-bindings, numba-cuda and the CUDA 12.9 wheels they load, pinned in hack/cuda-clients.txt) in a venv of their own under ~/.cache/vgpud, for tests/conformance/test_cuda_bindings.py and test_numba_cuda.py
	@./hack/install-cuda-clients.sh

node-deps: build  ## containerd 1.7, runc, CNI loopback, busybox + pause + cudaprobe images, containerd 2.x and NVIDIA's nvidia-ctk + nvidia-cdi-hook (built from their Go modules) into ~/.cache/vgpud (the probe links against build/fakecuda)
	@./hack/install-node.sh
	@./hack/install-containerd2.sh
	@./hack/install-nvidia-ctk.sh

cluster: build kube node-deps $(if $(CHART),image)  ## a local cluster until Ctrl-C: one control plane and NODES nodes (default 2) on this host, each with its containerd, kubelet, fake GPUs and vgpud; NRI per node by commas (default on,off: one NRI node, then eager ones); CONTAINERD=1.7,2 likewise; CHART=1: vgpud as the chart's DaemonSet
	@$(PY) -m tests.e2e.cluster --nodes $(or $(NODES),2) --nri $(or $(NRI),on,off) --containerd $(or $(CONTAINERD),1.7) $(if $(CHART),--chart)

cluster-test: build image kube node-deps  ## the cluster scenarios too long for make test (tests/clustertest: 100 pods on 3 nodes, a node lost, the chart across nodes and its rolling upgrade, an upgrade from a vgpud without nriMode), each one's time and the total printed
	@start=$$(date +%s); $(PY) -m pytest -q -s --durations=0 tests/clustertest; rc=$$?; \
	echo "make cluster-test: $$(( $$(date +%s) - start )) s (rc $$rc)"; exit $$rc

node: build kube node-deps  ## a local node (etcd, apiserver, controller manager, scheduler, containerd, kubelet, vgpud) until Ctrl-C; NRI=off for eager, CONTAINERD=2 for containerd 2.x
	@$(PY) -m tests.e2e.node --nri $(or $(NRI),on) --containerd $(or $(CONTAINERD),1.7)

test: build image kube chart-crds prometheus cuda-clients node-deps  ## every test tier that runs on this machine (as root: the e2e runs a node)
	@$(VENV)/bin/ruff check
	@$(VENV)/bin/ruff format --check --quiet
	@$(PY) -m pytest -q --durations=20 tests --ignore=tests/launcher --ignore=tests/cluster --ignore=tests/clustertest
	@# the launcher tests and the cluster start nodes of their own: never beside the e2e suite's node
	@$(PY) -m pytest -q tests/launcher
	@$(PY) -m pytest -q tests/cluster

unit: build
	@$(PY) -m pytest -q tests/unit

lint: setup
	@$(VENV)/bin/ruff check
	@$(VENV)/bin/ruff format --check

protos: setup  ## regenerate vgpud/_pb from protos/
	@./hack/gen-protos.sh

check-protos: setup  ## fail if vgpud/_pb is not what protos/ generates
	@./hack/gen-protos.sh --check

demo: build image kube node-deps  ## the main job on a real local node (root): a pod with two containers on one vGPU claim, then a CUDA program hitting its memory limit
	@$(PY) hack/demo.py

#: benches that start a local node (root, and the e2e lock, taken around each)
NODE_BENCHES := cri_latency footprint
BENCHES := $(filter-out summary $(NODE_BENCHES),$(basename $(notdir $(wildcard bench/*.py))))
BENCH_RESULTS := build/bench-results.jsonl

bench: build kube node-deps  ## every bench (bench/*.py; the local-node ones under /tmp/vgpud-e2e.lock), then one summary table
	@rm -f $(BENCH_RESULTS); failed=""; \
	for b in $(BENCHES); do echo "== bench/$$b.py"; \
		VGPUD_BENCH_RESULTS=$(BENCH_RESULTS) $(PY) bench/$$b.py || failed="$$failed $$b"; done; \
	for b in $(NODE_BENCHES); do echo "== bench/$$b.py (local node, holding /tmp/vgpud-e2e.lock)"; \
		VGPUD_BENCH_RESULTS=$(BENCH_RESULTS) flock /tmp/vgpud-e2e.lock $(PY) bench/$$b.py || failed="$$failed $$b"; done; \
	echo "== summary ($(BENCH_RESULTS))"; \
	$(PY) bench/summary.py $(BENCH_RESULTS) --ran $(BENCHES) $(NODE_BENCHES) \
		--expect nri_latency prepare scale stream webhook $(NODE_BENCHES) || failed="$$failed summary"; \
	[ -z "$$failed" ] || { echo "bench: failed:$$failed" >&2; exit 1; }

fuzz: setup  ## every fuzz target at volume (tests/fuzz; FUZZ_TARGET, FUZZ_N, FUZZ_SEED, FUZZ_INPUT to replay a crash)
	@FUZZ_TARGET=$(FUZZ_TARGET) FUZZ_N=$(FUZZ_N) FUZZ_SEED=$(FUZZ_SEED) FUZZ_INPUT=$(FUZZ_INPUT) FUZZ_RAW=$(FUZZ_RAW) \
		$(PY) -m tests.fuzz

soak: build image kube node-deps  ## a seeded churn on the local node with its invariants after each step (tests/soak; SOAK_N, SOAK_SEED, SOAK_TRACK=nri|eager; root, under /tmp/vgpud-e2e.lock); with SOAK_REPEAT=N instead each named chaos scenario N times (as make soak-repeat)
	@if [ -n "$(SOAK_REPEAT)" ]; then $(PY) -m tests.soakrepeat; \
	else SOAK_N=$(SOAK_N) SOAK_SEED=$(SOAK_SEED) SOAK_TRACK=$(SOAK_TRACK) flock /tmp/vgpud-e2e.lock $(PY) -m tests.soak; fi

.PHONY: soak-repeat
soak-repeat: build image kube node-deps  ## each named chaos scenario of the e2e SOAK_REPEAT times (default 20; SOAK_SCENARIOS: parts of names, by commas), then a table scenario x passes/N (tests/soakrepeat; root; takes /tmp/vgpud-e2e.lock per scenario)
	@$(PY) -m tests.soakrepeat

clean:
	rm -rf build .pytest_cache .ruff_cache
