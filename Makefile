# Sonde — whole-system eBPF profiler for the OpenTelemetry Collector.
# `make help` lists the targets.

SHELL        := /bin/bash
GO           ?= go
DIST         := _build/otelcol-profiling
FEATURE_GATE := service.profilesSupport
CONFIG       ?= config/local.yaml
FUZZTIME     ?= 10s
# make test fuzzes each target for a number of executions, not a duration:
# go1.26's fuzz coordinator can fail a duration run with a bare "context
# deadline exceeded" at the deadline, with no failing input (golang/go#75804,
# fixed in Go 1.27). A count has no deadline to race.
CI_FUZZTIME  ?= 3000x
GOTEST_FLAGS ?= -count=1 -timeout 45m
CLANG_FORMAT ?= clang-format-19

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: generate
generate: ## Regenerate eBPF objects and Go bindings (clang-19, llvm-strip-19) and collector metadata
	$(GO) generate ./support/... ./collector/... ./exporter/...

.PHONY: check-generated
check-generated: generate ## Fail if committed generated files differ from their sources
	@git diff --exit-code --stat -- support collector exporter || \
	  { echo "generated files are stale: run 'make generate' and commit the result"; exit 1; }

.PHONY: build
build: ## Build every package
	$(GO) build ./...

.PHONY: dist
dist: $(DIST) ## Build the otelcol-profiling distribution with OCB into _build/

$(DIST): builder-config.yaml go.mod $(shell git ls-files '*.go' 2>/dev/null)
	$(GO) tool builder --config builder-config.yaml

.PHONY: run
run: dist ## Profile this host with config/local.yaml (needs root or the capabilities in README)
	$(DIST) --config $(CONFIG) --feature-gates=$(FEATURE_GATE)

.PHONY: image
image: dist ## Build an OCI image tarball of otelcol-profiling (no Docker engine needed)
	$(GO) run ./internal/image/cmd/mkimage

.PHONY: chart-test
chart-test: dist ## Render and check the Helm chart, validating its Collector config with the distribution
	SONDE_OTELCOL=$(abspath $(DIST)) $(GO) test -count=1 ./deploy/...

.PHONY: lint
lint: ## gofmt, go vet, and clang-format of the eBPF C (support/ebpf/.clang-format)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(CLANG_FORMAT) --dry-run -Werror $$(git ls-files 'support/ebpf/*.[ch]' | grep -v '/vmlinux\.h$$')

.PHONY: fuzz-short
fuzz-short: ## Run every fuzz target for FUZZTIME (default 10s; Nx for N executions)
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; done

.PHONY: fuzz
fuzz: ## Run every fuzz target for 2 minutes
	$(MAKE) fuzz-short FUZZTIME=2m

.PHONY: test
test: check-generated lint dist ## Everything CI runs: generated files, lint, all tests (root runs the eBPF ones), short fuzzing
	SONDE_OTELCOL=$(abspath $(DIST)) $(GO) test $(GOTEST_FLAGS) ./...
	$(MAKE) fuzz-short FUZZTIME=$(CI_FUZZTIME)

.PHONY: bench
bench: ## Benchmarks: per-operation costs and the receiver's overhead (needs root)
	$(GO) test -run '^$$' -bench . -benchmem $$($(GO) list ./... | grep -v internal/bench)
	$(GO) test -run '^$$' -bench 'ReceiverOverhead|OffCPUOverhead' -benchtime 1x ./internal/bench

.PHONY: bench-scale
bench-scale: ## Scale and churn scenarios: 500 processes, exec storm, huge binary, 1000 Hz (needs root; ~6 min; SONDE_BENCH_SCALE_WINDOW, SONDE_BENCH_EXEC_STORM)
	$(GO) test -run '^$$' -bench 'Scale' -benchtime 1x -timeout 60m ./internal/bench
