# fanfare — see README.md.
GO        ?= go
PKGS      ?= ./...
BIN       := bin

.PHONY: all build run services services-stop test test-js test-browser bench bench-cluster load soak fuzz lint fmt clean

all: build

build:
	@echo "make build: bin/fanfared and bin/fanfare (a first build compiles the dependencies, a few minutes; packages are listed as they compile)"
	$(GO) build -v -o $(BIN)/ ./cmd/...

# Embedded mode: nothing but Go needed. Data in ./data.
run: build
	$(BIN)/fanfared

# Throwaway test Postgres and Redis (make test starts them itself when needed).
services:
	bash .ci/services start

services-stop:
	bash .ci/services stop

test:
	GO=$(GO) PKGS='$(PKGS)' bash .ci/test

# The JavaScript SDK's Node suite (client/js/test) against a real fanfared;
# needs node 20+ (npm ci runs first when node_modules is missing).
test-js:
	GO=$(GO) bash .ci/test-js

# The browser suite (web/e2e): the demo and the admin console in headless
# Chromium (Debian's chromium) via playwright-core; screenshots in
# test-output/browser/. bash .ci/web-deps installs what it needs.
test-browser:
	GO=$(GO) bash .ci/test-browser

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 $(PKGS)

# One group's members online across fanfared nodes in cluster mode
# (docs/benchmarks.md, "One group across nodes"): starts its own throwaway
# Postgres and Redis; BENCH_ONLINE, BENCH_OUT, BENCH_ARGS (see .ci/bench-cluster).
bench-cluster: build
	bash .ci/bench-cluster

load: build
	$(BIN)/fanfare bench broadcast

# The soak test (docs/reliability.md, "Soak"): a mixed workload against
# fresh fanfared processes for SOAK_DURATION per mode (embedded, cluster or
# both; cluster mode starts its own throwaway Postgres and Redis), a ledger of
# every message and membership change, resources checked for upward trends.
# Report (markdown, JSON, CSV, SVG plots) in SOAK_OUT/<mode>. CI runs 2m;
# the published run is `make soak SOAK_DURATION=30m`.
SOAK_DURATION ?= 2m
SOAK_MODE     ?= both
SOAK_OUT      ?= test-output/soak
soak: build
	SOAK_DURATION=$(SOAK_DURATION) SOAK_MODE=$(SOAK_MODE) SOAK_OUT=$(SOAK_OUT) bash .ci/soak

fuzz:
	bash .ci/fuzz

lint:
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@latest $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)
