# fanfare — see README.md.
GO        ?= go
PKGS      ?= ./...
TEST_PG   ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
TEST_REDIS?= 127.0.0.1:6379
BIN       := bin

export FANFARE_TEST_POSTGRES_URL ?= $(TEST_PG)
export FANFARE_TEST_REDIS_ADDR   ?= $(TEST_REDIS)

.PHONY: all build run services test bench load fuzz lint fmt clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# Embedded mode: nothing but Go needed. Data in ./data.
run: build
	$(BIN)/fanfared

services:
	bash .ci/services

test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 9m $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 $(PKGS)

load: build
	$(BIN)/fanfare bench broadcast

fuzz:
	bash .ci/fuzz

lint:
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@latest $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)
