# Sonde — whole-system eBPF profiler for the OpenTelemetry Collector.
# `make help` lists the targets.

SHELL        := /bin/bash
GO           ?= go
DIST         := _build/otelcol-profiling
# The Collector release of the distribution, read from builder-config.yaml; the
# Collector Builder (OCB) of the same release builds it. Sonde's own go.mod
# requires the oldest Collector it supports, so OCB is not a go.mod tool.
COLLECTOR_VERSION := $(shell sed -n 's|.*collector/receiver/otlpreceiver \(v[0-9.]*\).*|\1|p' builder-config.yaml)
OCB          := $(GO) run go.opentelemetry.io/collector/cmd/builder@$(COLLECTOR_VERSION)
FEATURE_GATE := service.profilesSupport
CONFIG       ?= config/local.yaml
FUZZTIME     ?= 10s
# make test fuzzes each target for a number of executions, not a duration:
# go1.26's fuzz coordinator can fail a duration run with a bare "context
# deadline exceeded" at the deadline, with no failing input (golang/go#75804,
# fixed in Go 1.27). A count has no deadline to race.
CI_FUZZTIME  ?= 3000x
# Minimizing a new input found in a big seed (a whole ELF file) can take
# the default minute per input, with no executions counted meanwhile.
FUZZMINTIME  ?= 10s
# One test package at a time (-p 1): as root, the integration packages
# (collector, profiler, python, symbolize, kernelcheck) each run their own
# host-wide profilers, perf record and CPU-bound workloads. Two at once on a
# 2-CPU machine is two agents on one host, which no user runs, and their
# workloads starve each other: a CI run saw a cgo workload's main thread
# sampled under 1,000 times in 120 s. Packages run in about 12 minutes so.
GOTEST_FLAGS ?= -count=1 -timeout 45m -p 1
CLANG_FORMAT ?= clang-format-19
# golangci-lint, pinned in its own module (tools/go.mod) so its dependencies
# stay out of the module graph of everyone who imports the receiver; go tool
# builds it from the module proxy the first time (a few minutes).
GOLANGCI_LINT ?= $(GO) tool -modfile=tools/go.mod golangci-lint

# Debian 12 packages the tests and `make generate` use, in one place: clang and
# llvm-strip for the eBPF objects, the C/C++ toolchains and binutils the test
# workloads are built and checked with, perf and addr2line as oracles, the
# kernel check's QEMU, linkers and BOLT for the workloads that need them,
# Prometheus and sqlite3 for the tests of the profile metrics and the SQLite
# exporter, the aarch64 cross toolchain and QEMU the arm64 tests use, QEMU's
# user-mode emulator that runs the arm64 release binary (`make release`),
# skopeo, which reads the OCI image index as registries and runtimes do, and
# the real programs the interpreter tests profile (cloc, composer).
# `make deps` installs the missing ones (as root) or names them.
DEB_PACKAGES := clang-19 llvm-19 bpftool libbpf-dev binutils gcc g++ make git \
                xz-utils linux-perf libc6-dbg qemu-system-x86 lld-19 bolt-19 \
                mold clang-format-19 rustc prometheus sqlite3 php-cli php-fpm \
                php8.2-dev ruby gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-system-arm \
                qemu-user-static skopeo perl libperl5.36 libdevel-nytprof-perl cloc \
                composer

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: generate
generate: ## Regenerate eBPF objects and Go bindings (clang-19, llvm-strip-19) and collector metadata
	$(GO) generate ./support/... ./collector/... ./exporter/... ./connector/...

.PHONY: check-generated
check-generated: generate ## Fail if committed generated files differ from their sources
	@git diff --exit-code --stat -- support collector exporter connector tracer/testrun_x86_bpfel_test.go tracer/testrun_x86_bpfel_test.o tracer/testrunarm64_bpfel_test.go tracer/testrunarm64_bpfel_test.o || \
	  { echo "generated files are stale: run 'make generate' and commit the result"; exit 1; }

.PHONY: build
build: ## Build every package
	$(GO) build ./...

.PHONY: dist
dist: $(DIST) ## Build the otelcol-profiling distribution with OCB into _build/

$(DIST): builder-config.yaml go.mod $(shell git ls-files '*.go' 2>/dev/null)
	$(OCB) --config builder-config.yaml

# The distribution for another architecture (`make dist-arm64`): OCB itself
# is built for this machine, the distribution with GOARCH set (no cgo, so no
# cross C toolchain is needed).
DIST_ARM64   := _build/linux-arm64/otelcol-profiling
OCB_BIN      := _build/bin/builder-$(COLLECTOR_VERSION)

$(OCB_BIN):
	mkdir -p $(dir $@) && GOBIN=$(abspath _build/tmp-ocb) $(GO) install go.opentelemetry.io/collector/cmd/builder@$(COLLECTOR_VERSION)
	mv _build/tmp-ocb/builder $@ && rmdir _build/tmp-ocb

.PHONY: dist-arm64
dist-arm64: $(DIST_ARM64) ## Cross-build otelcol-profiling for linux/arm64 into _build/linux-arm64/

$(DIST_ARM64): $(OCB_BIN) builder-config.yaml go.mod $(shell git ls-files '*.go' 2>/dev/null)
	mkdir -p $(dir $@)
	sed -e 's|^  output_path: .*|  output_path: $(abspath $(dir $@))|' \
	    -e 's|^  - github.com/sonde-dev/sonde => .*|  - github.com/sonde-dev/sonde => $(CURDIR)|' \
	    builder-config.yaml > $(dir $@)builder-config.yaml
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(OCB_BIN) --config $(dir $@)builder-config.yaml

.PHONY: run
run: dist ## Profile this host with config/local.yaml (needs root or the capabilities in README)
	$(DIST) --config $(CONFIG) --feature-gates=$(FEATURE_GATE)

# A release: `make release VERSION=x.y.z` (see README). The distribution is
# rebuilt for each of RELEASE_ARCHES (static, CGO_ENABLED=0, the same
# ldflags) with dist.version set to VERSION, so `otelcol-profiling --version`
# prints it; VERSION_VAR names the Go variable the receiver reports as its
# scope version. OCB is built for this machine and run with GOARCH set, as
# for dist-arm64.
VERSION      ?=
VERSION_VAR  := github.com/sonde-dev/sonde/internal/version.Version
RELEASE_DIR  ?= _build/release/$(VERSION)
RELEASE_BUILD := _build/release-build
RELEASE_ARCHES := amd64 arm64

.PHONY: release
release: $(OCB_BIN) ## Versioned artifacts in _build/release/VERSION for linux/amd64 and linux/arm64: static binary tarballs, SBOMs, OCI images and their index, Helm chart, SHA256SUMS
	@[[ "$(VERSION)" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$ ]] || \
	  { echo "usage: make release VERSION=x.y.z (a semantic version without the v)"; exit 2; }
	rm -rf $(RELEASE_DIR) $(RELEASE_BUILD) && mkdir -p $(RELEASE_DIR) $(RELEASE_BUILD)
	set -e; for arch in $(RELEASE_ARCHES); do \
	  out=$(abspath $(RELEASE_BUILD))/linux-$$arch; mkdir -p $$out; \
	  sed -e 's|^  version: .*|  version: $(VERSION)|' \
	      -e "s|^  output_path: .*|  output_path: $$out|" \
	      -e 's|^  - github.com/sonde-dev/sonde => .*|  - github.com/sonde-dev/sonde => $(CURDIR)|' \
	      builder-config.yaml > $$out/builder-config.yaml; \
	  GOOS=linux GOARCH=$$arch CGO_ENABLED=0 $(OCB_BIN) --config $$out/builder-config.yaml \
	    --ldflags='-s -w -X $(VERSION_VAR)=$(VERSION)'; \
	done
	$(GO) run ./internal/image/cmd/mkimage -version $(VERSION) -out $(RELEASE_DIR) \
	  $(foreach a,$(RELEASE_ARCHES),-binary $(RELEASE_BUILD)/linux-$(a)/otelcol-profiling)
	$(GO) run ./internal/release/cmd/release -version $(VERSION) -out $(RELEASE_DIR) \
	  $(foreach a,$(RELEASE_ARCHES),-binary $(RELEASE_BUILD)/linux-$(a)/otelcol-profiling)
	SONDE_RELEASE_DIR=$(abspath $(RELEASE_DIR)) SONDE_RELEASE_VERSION=$(VERSION) \
	  $(GO) test -count=1 -run TestReleaseDirectory ./internal/release

.PHONY: compat
compat: ## Build and unit-test the receiver, profiler and exporter against the newest Collector the proxy serves
	.ci/compat newest

.PHONY: image
image: dist dist-arm64 ## OCI images of otelcol-profiling for linux/amd64 and linux/arm64 and their index, in _build/image/ (no Docker engine needed)
	$(GO) run ./internal/image/cmd/mkimage -out _build/image -binary $(DIST) -binary $(DIST_ARM64)

.PHONY: chart-test
chart-test: dist ## Render and check the Helm chart, validating its Collector config with the distribution
	SONDE_OTELCOL=$(abspath $(DIST)) $(GO) test -count=1 ./deploy/...

.PHONY: lint
lint: cross ## gofmt, go vet, golangci-lint (.golangci.yml), clang-format of the eBPF C (support/ebpf/.clang-format), and the cross builds
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...
	$(CLANG_FORMAT) --dry-run -Werror $$(git ls-files 'support/ebpf/*.[ch]' | grep -v '/vmlinux\.h$$')

.PHONY: cross
cross: ## Build for linux/arm64 (every package, vetted) and the public packages for other systems: a distribution that includes the receiver builds there (Start says Linux only)
	GOOS=linux GOARCH=arm64 $(GO) build ./...
	GOOS=linux GOARCH=arm64 $(GO) vet ./...
	GOOS=darwin $(GO) build ./collector/... ./profiler/...
	GOOS=windows $(GO) build ./collector/... ./profiler/...

.PHONY: fuzz-short
fuzz-short: ## Run every fuzz target for FUZZTIME (default 10s; Nx for N executions)
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINTIME) $$pkg; \
	  done; done

.PHONY: fuzz
fuzz: ## Run every fuzz target for 2 minutes
	$(MAKE) fuzz-short FUZZTIME=2m

.PHONY: deps
deps: ## Install the Debian packages in DEB_PACKAGES that are missing (as root; otherwise name them and fail)
	@missing=$$(for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	missing=$$(echo $$missing); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "missing Debian packages: $$missing"; \
	  echo "install them as root, then run make again:"; \
	  echo "  apt-get update && apt-get install -y --no-install-recommends $$missing"; \
	  exit 1; \
	fi; \
	echo "installing $$missing"; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -q && apt-get install -y -q --no-install-recommends $$missing

.PHONY: test
test: deps check-generated lint dist ## Everything CI runs: packages, generated files, lint, all tests (root runs the eBPF ones), newest Collector, short fuzzing
	SONDE_OTELCOL=$(abspath $(DIST)) $(GO) test $(GOTEST_FLAGS) ./...
	$(MAKE) compat
	$(MAKE) fuzz-short FUZZTIME=$(CI_FUZZTIME)

# make bench runs these scenarios of BenchmarkDist (a regular expression:
# BENCH_SCENARIOS='burners|node'; the scenarios are idle, burners, node,
# highrate, python, java, nodejs, php, perl and ruby); SONDE_BENCH_* knobs are in internal/bench/dist_test.go.
BENCH_SCENARIOS ?= .*

.PHONY: bench
bench: dist ## The distribution profiling this host: idle, four burners, node-like host, high rate, Python, Java, Node.js, PHP, Perl, Ruby; tables + JSON in _build/bench/ (root; ~22 min, +10 with REF_BIN)
	SONDE_OTELCOL=$(abspath $(DIST)) $(GO) test -run '^$$' -bench '^BenchmarkDist$$/^($(BENCH_SCENARIOS))$$' -benchtime 1x -timeout 40m ./internal/bench

.PHONY: bench-micro
bench-micro: ## Per-operation benchmarks of packages, and the receiver's overhead in a test binary (root; ~8 min)
	$(GO) test -run '^$$' -bench . -benchmem $$($(GO) list ./... | grep -v internal/bench)
	$(GO) test -run '^$$' -bench 'ReceiverOverhead|OffCPUOverhead' -benchtime 1x ./internal/bench

.PHONY: bench-scale
bench-scale: ## Scale and churn scenarios: 500 processes, exec storm, huge binary, 1000 Hz (needs root; ~6 min; SONDE_BENCH_SCALE_WINDOW, SONDE_BENCH_EXEC_STORM)
	$(GO) test -run '^$$' -bench 'Scale' -benchtime 1x -timeout 60m ./internal/bench
