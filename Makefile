# TalkIDE platform. `make run` starts the whole platform on this machine;
# `make test` runs every test. Both install what they need first.

SHELL := /bin/bash
GO ?= go
# The pinned Claude Code CLI version lives in exactly one place:
CLAUDE_CODE_VERSION := $(shell cat internal/worker/claudecli/version.txt)
TOOLS := $(CURDIR)/.tools
CLAUDE_DIR := $(TOOLS)/claude-code
CLAUDE_BIN := $(CLAUDE_DIR)/node_modules/.bin/claude
CLAUDE_STAMP := $(CLAUDE_DIR)/.installed-$(CLAUDE_CODE_VERSION)
BIN := $(CURDIR)/bin
# The test cluster's pinned versions (etcd, Kubernetes, kwok) live in exactly
# one place; internal/kubetest embeds the same file and names the same dir.
include internal/kubetest/versions.env
K8S_BIN_DIR := $(CURDIR)/.cache/k8s/k8s-$(K8S_VERSION)_etcd-$(ETCD_VERSION)_kwok-$(KWOK_VERSION)
# The real node's (kubelet, kube-proxy, containerd, runc, CNI plugins,
# CoreDNS), pinned in the same file; kubetest.NodeKey names the same dir.
NODE_BIN_DIR := $(CURDIR)/.cache/k8s/node-k8s-$(K8S_VERSION)_containerd-$(CONTAINERD_VERSION)_runc-$(RUNC_VERSION)_cni-$(CNI_PLUGINS_VERSION)_coredns-$(COREDNS_VERSION)
# Helm's pinned versions (4 and 3) live in deploy/versions.env; the chart tests
# read the same file.
include deploy/versions.env
HELM := $(CURDIR)/.cache/tools/helm-$(HELM_VERSION)/helm
HELM3 := $(CURDIR)/.cache/tools/helm-$(HELM3_VERSION)/helm

# The browser UI's npm packages are installed again only when the lockfile
# changes: the stamp's name is the lockfile's sha256.
WEB_STAMP := web/node_modules/.installed-$(shell sha256sum web/package-lock.json | cut -d' ' -f1)
# Likewise the official TypeScript SDK the gateway's tests drive.
SDK_TS_DIR := internal/controlplane/gateway/testdata/ts-sdk
SDK_TS_STAMP := $(SDK_TS_DIR)/node_modules/.installed-$(shell sha256sum $(SDK_TS_DIR)/package-lock.json | cut -d' ' -f1)

export TALKIDE_CLAUDE_BIN := $(CLAUDE_BIN)

.PHONY: run test check help fuzz tools build vet fmt-check clean chaos web sdk-ts
.DEFAULT_GOAL := help

## help: list the targets, one line each (plain `make` does this)
help:
	@echo "TalkIDE: make run starts the platform on this machine, make test runs every test (README.md)."
	@awk 'FNR == NR { if (match($$0, /^[a-z][a-z0-9-]*:/)) rule[substr($$0, 1, RLENGTH - 1)] = 1; next } \
		/^## [a-z][a-z0-9-]*: / { name = $$2; sub(/:$$/, "", name); if (name in rule) { text = $$0; sub(/^## [a-z0-9-]*: /, "", text); printf "  %-14s %s\n", name, text } }' \
		$(firstword $(MAKEFILE_LIST)) $(firstword $(MAKEFILE_LIST))

## tools: install the pinned Claude Code CLI, bubblewrap, Gradle and Chromium (once)
## The CLI goes into .tools/ (git-ignored); bubblewrap jails each agent, Gradle
## with JUnit 4 is the local build runner, Chromium is what the browser tests
## drive (Debian's packages; as root via apt-get).
tools: $(CLAUDE_STAMP) bwrap gradle chromium

## bwrap: install Debian's bubblewrap, the agents' jail (part of tools)
.PHONY: bwrap
bwrap:
	@command -v bwrap >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing bubblewrap (agent containment)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
		else \
			echo "bubblewrap (bwrap) is needed to contain agents: install it (Debian: sudo apt-get install bubblewrap)" >&2; exit 1; \
		fi; }

# Debian's gradle (4.4.1, on the distribution's OpenJDK) and junit4 (with
# hamcrest): the local build runner's Gradle and the bundled sample project's
# test libraries, offline (docs/builds.md). Without root, a missing one is
# named and the rest goes on: the platform runs without builds, and the
# local runner's tests fail saying the same.
## gradle: install Debian's Gradle and JUnit 4, the local build runner (part of tools)
.PHONY: gradle
gradle:
	@command -v gradle >/dev/null && [ -r /usr/share/java/junit4.jar ] || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian's gradle and junit4 (the local build runner; about 1 minute, 90 packages with a JDK already there)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq gradle junit4 >/dev/null; \
		else \
			echo "gradle and junit4 are needed for builds on this machine: install them (Debian: sudo apt-get install gradle junit4)" >&2; \
		fi; }

# Debian's chromium: the headless browser the browser tests drive
# (internal/e2e/browser_test.go, through playwright-core). Without root it
# is named and the rest goes on; the browser test then fails saying so.
## chromium: install Debian's Chromium, which the browser tests drive (part of tools)
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian's chromium (the browser tests' headless browser; about 1 minute)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq chromium >/dev/null; \
		else \
			echo "chromium is needed for the browser tests: install it (Debian: sudo apt-get install chromium)" >&2; \
		fi; }

# The stamp's name holds the version, so a new version.txt misses it and
# reinstalls; version.txt is not a prerequisite, or a fresh checkout (a git
# worktree sharing .tools/) would look newer than the install and reinstall
# the CLI under everyone who shares it.
$(CLAUDE_STAMP):
	@command -v npm >/dev/null || { echo "npm is required to install the Claude Code CLI" >&2; exit 1; }
	@echo "installing the pinned Claude Code CLI $(CLAUDE_CODE_VERSION) from npm into .tools/ (about a minute, once per version)"
	rm -rf $(CLAUDE_DIR) && mkdir -p $(CLAUDE_DIR)
	cd $(CLAUDE_DIR) && npm install --no-save --no-audit --no-fund --loglevel=error \
		--prefix $(CLAUDE_DIR) @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	@v=$$($(CLAUDE_BIN) --version | cut -d' ' -f1); [ "$$v" = "$(CLAUDE_CODE_VERSION)" ] || \
		{ echo "installed Claude Code CLI is $$v, want $(CLAUDE_CODE_VERSION)" >&2; exit 1; }
	touch $@

## web: bundle the browser UI (web/src) into internal/controlplane/webui/dist
## The control plane embeds it; its npm packages are installed first when
## web/package-lock.json changed (web/node_modules, git-ignored).
web: $(WEB_STAMP)
	@echo "bundling the browser UI (web/src into internal/controlplane/webui/dist)"
	@node web/build.mjs

$(WEB_STAMP):
	@command -v npm >/dev/null || { echo "npm is required to build the browser UI (Debian: sudo apt-get install npm)" >&2; exit 1; }
	@echo "installing the UI's npm packages (first time: ~10 s)"
	cd web && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

## sdk-ts: install the pinned Anthropic TypeScript SDK the gateway's tests drive
## internal/controlplane/gateway's tests drive it through the gateway-proxy with Node
## ($(SDK_TS_DIR)/node_modules, git-ignored).
sdk-ts: $(SDK_TS_STAMP)

$(SDK_TS_STAMP):
	@command -v npm >/dev/null || { echo "npm is required to install the TypeScript SDK the gateway's tests drive (Debian: sudo apt-get install npm)" >&2; exit 1; }
	cd $(SDK_TS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

## build: compile every binary into bin/ (the browser UI bundled first)
build: web
	@[ -x $(BIN)/talkide ] || echo "building the platform's binaries into bin/: on a machine whose Go caches are empty this downloads the Go modules and compiles everything, 3 to 5 minutes on 2 cores; later builds take seconds"
	$(GO) build -o $(BIN)/ ./cmd/...

## run: the whole platform on this machine (control plane, one worker, dev upstream)
run: tools web build
	$(BIN)/talkide run

# PG_WARN says before a test run when the PostgreSQL tests are skipped on
# purpose or will fail for want of a server.
PG_WARN = if [ "$$TALKIDE_SKIP_POSTGRES" = 1 ]; then echo "WARNING: TALKIDE_SKIP_POSTGRES=1: the PostgreSQL tests (control store, budget, gateway, control plane) are SKIPPED on purpose; this run does not cover PostgreSQL" >&2; \
	elif [ -z "$$TALKIDE_TEST_POSTGRES_URL" ] && ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then echo "WARNING: nothing listens on 127.0.0.1:5432: the PostgreSQL tests will fail (README, \"What a fresh machine needs\"); set TALKIDE_SKIP_POSTGRES=1 to skip them on purpose" >&2; fi

## test: the whole suite, with the race detector (what CI runs; .ci/run)
## Against the real CLI, PostgreSQL, the test cluster (built first by
## cluster-bins), Chromium; the chart tests use the pinned Helms (helm) and
## the images (images).
test: tools web sdk-ts cluster-bins helm images vet fmt-check tidy-check
	@$(PG_WARN)
	@echo "go test -race ./...: 16 to 25 minutes on 2 cores (16 to 20 measured warm on a quiet one; longer the first time, when everything compiles with the race detector); each package prints one line when it is done"
	$(GO) test -race -count=1 -timeout 30m ./...
	@[ "$$TALKIDE_SKIP_POSTGRES" != 1 ] || echo "WARNING: the tests passed WITHOUT the PostgreSQL tests (TALKIDE_SKIP_POSTGRES=1)" >&2

## check: the fast lane: vet, gofmt, tidy and every test without cluster, CLI or browser
## `go test -short`: the tests that need the test cluster, the real Claude Code
## CLI (the browser tests too), Helm or the node's packages say so and are left
## to `make test` (internal/testlane); about 2 minutes warm on 2 cores, 10 with
## empty Go caches (docs/testing.md). Needs PostgreSQL as make test does.
## `make test` stays the whole suite and is what CI runs.
check: tools web sdk-ts vet fmt-check tidy-check
	@$(PG_WARN)
	$(GO) test -short -count=1 ./...

## fuzz: run every fuzz target for FUZZTIME (default 10s) and print its executions
## scripts/fuzz finds the FuzzXxx functions, runs each with `go test -fuzz` and
## ends with one line; a failing input is kept in the package's testdata/fuzz/.
FUZZTIME ?= 10s
fuzz:
	GO=$(GO) $(GO) run ./scripts/fuzz -fuzztime $(FUZZTIME)

## vet: go vet ./...
vet:
	@echo "go vet ./...: up to 3 minutes the first time (it type-checks every package and its tests), seconds afterwards"
	$(GO) vet ./...

## tidy-check: fail unless go.mod and go.sum are tidy (go mod tidy -diff)
# go.mod and go.sum say exactly what the code imports (go mod tidy).
.PHONY: tidy-check
tidy-check:
	@$(GO) mod tidy -diff >/dev/null 2>&1 || { echo "go.mod or go.sum is not tidy: run go mod tidy" >&2; $(GO) mod tidy -diff >&2; exit 1; }

## fmt-check: fail unless every Go file is gofmt-formatted
fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt needed: $$out" >&2; exit 1; }

## helm: build the pinned Helm 4 and Helm 3 into .cache/tools/ (once per version)
## From the Go module proxy into .cache/tools/helm-<version>/ (git-ignored).
.PHONY: helm
helm: $(HELM) $(HELM3)

# The version is in the path: a new pin builds anew, the old one is left.
$(CURDIR)/.cache/tools/helm-%/helm:
	@echo "building helm $* from the Go module proxy into $(@D): 3 to 6 minutes, once per pinned version"
	@major=$$(echo $* | sed -E 's/^v([0-9]+).*/\1/'); \
	GOBIN=$(@D).tmp nice -n 10 $(GO) install helm.sh/helm/v$$major/cmd/helm@$* && \
	rm -rf $(@D) && mv $(@D).tmp $(@D)

## images: build the three OCI images into .cache/images/, without a daemon
## talkide-controlplane, talkide-worker and talkide-builder-gradle, reproducibly
## (docs/images.md); the Debian bases of the worker and the builder are made once
## with debootstrap (root) and cached. Ends with one line per image:
## `image NAME@sha256:DIGEST PATH` (PATH: its OCI image layout).
.PHONY: images
images: tools web
	@echo "building the three container images into .cache/images/: about a minute; the first time 3 to 10 minutes, most of it the Debian bases of the worker and the Gradle builder made with debootstrap (2 min 42 s and 9 min 38 s measured on fresh machines, depending on the Debian mirror)"
	@nice -n 10 $(GO) run ./scripts/images

## cluster-bins: build the test cluster's and the real node's binaries (once per version)
## From the Go module proxy into .cache/k8s/<versions>/ and
## .cache/k8s/node-<versions>/ (git-ignored); a no-op while the versions are
## unchanged.
.PHONY: cluster-bins cluster cluster-down cluster-demo node-tools
cluster-bins: $(K8S_BIN_DIR)/.stamp $(NODE_BIN_DIR)/.stamp

$(K8S_BIN_DIR)/.stamp: internal/kubetest/versions.env
	@[ -x $(K8S_BIN_DIR)/kube-apiserver ] || echo "building the test cluster's etcd, Kubernetes and kwok $(K8S_VERSION) from the Go module proxy into $(K8S_BIN_DIR): once per pinned version; 15 to 55 minutes on 2 cores with an empty Go build cache (16 measured on a quiet machine, 53 under heavy load), about 2 with a warm one. This is normal; make test goes on by itself afterwards."
	nice -n 10 $(GO) run ./scripts/cluster bins
	@touch $@

# The stamp is the one EnsureNodeBuilt writes when the set is complete.
$(NODE_BIN_DIR)/.stamp: | node-tools $(K8S_BIN_DIR)/.stamp
	@echo "building the real node's kubelet, kube-proxy, containerd, runc, CNI plugins and CoreDNS from the Go module proxy into $(NODE_BIN_DIR): once per pinned version; 4 to 7 minutes after the cluster's binaries on a quiet machine (their build cache is shared), 20 on its own. This is normal."
	nice -n 10 $(GO) run ./scripts/cluster node-bins

## node-tools: install Debian's packages the real node needs (as root)
## Via apt-get: libseccomp-dev (runc), iptables and conntrack (kube-proxy),
## bindfs and fuse3 (the NFS stand-in), busybox-static (a test image).
node-tools:
	@missing=""; for c in iptables:iptables conntrack:conntrack bindfs:bindfs fusermount3:fuse3 busybox:busybox-static; do \
		command -v $${c%%:*} >/dev/null || missing="$$missing $${c#*:}"; done; \
	[ -r /usr/include/seccomp.h ] || missing="$$missing libseccomp-dev"; \
	[ -z "$$missing" ] || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian's$$missing (the test cluster's real node; about 20 seconds)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq $$missing >/dev/null; \
		else \
			echo "the test cluster's real node needs Debian's$$missing: install them as root (apt-get install$$missing)" >&2; exit 1; \
		fi; }

## cluster: start the test cluster in the background and print KUBECONFIG=<path>
## With a real node beside the kwok nodes when run as root (kubelet,
## containerd, runc; the images of `make images` loaded); its kubectl is in
## $(K8S_BIN_DIR).
cluster: cluster-bins
	@$(GO) run ./scripts/cluster up

## cluster-down: stop the test cluster and leave nothing of it behind
cluster-down:
	@$(GO) run ./scripts/cluster down

## cluster-demo: the operator's path in one command: cluster, chart, a tenant, its URL
## Builds what is missing, starts the test cluster with its real node (root),
## loads the images of `make images`, installs the chart (the development
## upstream standing in for Anthropic), provisions tenant demo/dev on the real
## node and prints KUBECONFIG=<path> and URL=<address>#token=<token>; make
## cluster-down removes all of it.
cluster-demo: cluster-bins images helm
	@$(GO) run ./scripts/cluster demo -helm $(HELM)

## clean: remove bin/, the one-machine run's state (.talkide) and the bundled UI
clean:
	rm -rf $(BIN) .talkide
	find internal/controlplane/webui/dist -mindepth 1 ! -name NOT-BUILT.txt -delete

## chaos: the crash test, longer (KILLS SIGKILLs, default 200)
KILLS ?= 200
chaos: tools
	set -o pipefail; $(GO) test -count=1 -timeout 120m -run TestChaos ./internal/chaos -chaos.kills=$(KILLS) -v \
		| grep -E --line-buffered '^(chaos |--- |FAIL|ok|\s+chaos_test)'

## bench-gateway: what the gateway-proxy adds to a model call (latency, throughput)
## Direct vs through it, on SQLite and PostgreSQL (docs/benchmarks.md);
## BENCH_FLAGS=-h lists options.
.PHONY: bench-gateway
bench-gateway:
	$(GO) run ./scripts/bench-gateway $(BENCH_FLAGS)

## bench-fanout: browser streams per control-plane process and their latency (30 s)
## How many one holds, bytes per stream, event latency for 1,000 conversations
## x 10 viewers and for one conversation x 10,000 viewers, against direct
## readers (docs/benchmarks.md).
.PHONY: bench-fanout
bench-fanout:
	$(GO) run ./scripts/bench-fanout $(BENCH_FLAGS)

## bench-jail: what agent containment adds to starting an agent process
## Plain vs jailed, alternating; needs root and bwrap.
.PHONY: bench-jail
bench-jail: bwrap
	$(GO) run ./scripts/bench-jail $(BENCH_FLAGS)

## bench-worker: the worker at scale: idle, active and per-turn figures (8 min)
## 100,000 idle conversations, 200 active stand-in agents, per-turn overhead
## against the direct CLI (docs/benchmarks.md, "bench-worker"; needs root, bwrap
## and the pinned CLI of `make tools`). Not `tools` as a prerequisite: a
## worktree's fresh version.txt would look newer than a shared .tools/ and
## reinstall the CLI under others.
.PHONY: bench-worker
bench-worker: bwrap
	$(GO) run ./scripts/bench-worker $(BENCH_FLAGS)
