# Order service: local development, tests and e2e.
# `make` (or `make help`) lists the targets. Local state lives in .local/.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

# PostgreSQL for `make test`, `make test/race` and `make bench` (throwaway, fsync off).
# Override both to run two of them at once: make test/race TEST_PG_PORT=55501 TEST_PG_DIR=.local/test-race
TEST_PG_DIR  ?= .local/test
TEST_PG_PORT ?= 54349
TEST_DB_URL  := postgres://postgres@127.0.0.1:$(TEST_PG_PORT)/postgres?sslmode=disable

# PostgreSQL of `make run` (reused by `make migrate` when DATABASE_URL is
# unset); STACK_DIR and PG_PORT name a second stack's, as they do for `make run`.
RUN_PG_DIR  := $(or $(STACK_DIR),.local/run)
RUN_PG_PORT := $(or $(PG_PORT),54329)

# Where `make http` sends api.http (the address of `make run`, or of the
# stack STACK_DIR and API_PORT name), with the dev token that stack wrote.
BASE_URL   ?= http://localhost:$(or $(API_PORT),8080)
TOKEN_FILE ?= $(RUN_PG_DIR)/dev-token
HTTPYAC  := npx --yes httpyac@6

# $(call with_test_pg,COMMAND): start a fresh test PostgreSQL, run COMMAND with
# TEST_DATABASE_URL set, always stop PostgreSQL again, keep COMMAND's status.
define with_test_pg
scripts/pg.sh wipe $(TEST_PG_DIR) >/dev/null; \
scripts/pg.sh start $(TEST_PG_DIR) $(TEST_PG_PORT) --fast; \
trap 'scripts/pg.sh stop $(TEST_PG_DIR)' EXIT; \
trap 'exit 130' INT; trap 'exit 143' TERM; \
export TEST_DATABASE_URL='$(TEST_DB_URL)'; $(1)
endef

.PHONY: help run test test/race fuzz e2e http migrate lint bench bench/micro clean cluster cluster/stop cluster-test faults faults-short dashboard-png

help: ## Show this help
	@echo "Usage: make <target>"
	@echo
	@grep -hE '^[a-zA-Z0-9_/-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-14s %s\n", $$1, $$2}'

run: ## Run PostgreSQL, NATS, api (:8080), projector (:8081), payment worker (:8082) and fakepsp (:12111) in the foreground; Ctrl-C stops all
	@scripts/stack.sh run

# Fuzz targets and how long `make test` runs each (FUZZTIME=5m make fuzz for
# longer). `make test` gives each a count of inputs, not a time: a timed run
# can fail with a bare "context deadline exceeded" when its time ends while a
# worker is busy (go.dev/issue/75804, fixed in Go 1.27), as on a loaded machine.
FUZZ_TARGETS := FuzzCreateOrder:./httpapi FuzzCheckKeys:./httpapi
FUZZTIME ?= 15s
FUZZ_TEST_INPUTS ?= 10000x
fuzz_all = for t in $(FUZZ_TARGETS); do go test -run='^$$' -fuzz="^$${t%%:*}$$" -fuzztime=$(1) "$${t\#*:}" || exit 1; done

# The noisy-neighbour test compares latencies, so it runs alone, after the
# other packages' tests (which run in parallel with each other).
NOISY_TEST := ^TestNoisyNeighbour$$

test: ## Run all tests and a short fuzz run against a throwaway PostgreSQL (127.0.0.1:54349)
	@$(call with_test_pg,go test -count=1 -skip '$(NOISY_TEST)' ./... && go test -count=1 -run '$(NOISY_TEST)' ./internal/app && $(call fuzz_all,$(FUZZ_TEST_INPUTS)))

fuzz: ## Fuzz the HTTP API for longer (15 s a target; FUZZTIME=5m for more)
	@$(call with_test_pg,$(call fuzz_all,$(FUZZTIME)))

test/race: ## Like test, with the race detector (without the noisy-neighbour test: it times latencies)
	@$(call with_test_pg,go test -race -count=1 -skip '$(NOISY_TEST)' ./...)

e2e: ## Start a fresh stack in .local/e2e and run api.http against it with httpyac
	@scripts/stack.sh e2e

http: ## Send api.http to a running `make run` (another stack: the same STACK_DIR and API_PORT as its make run)
	@command -v curl >/dev/null 2>&1 || { echo 'curl is needed: make http asks the stack whether it is ready' >&2; exit 1; }
	@command -v npx >/dev/null 2>&1 || { echo 'npx (Node.js 18 or later) is needed: make http sends api.http with httpyac' >&2; exit 1; }
	@if ! curl -s -o /dev/null -m 5 '$(BASE_URL)/readyz'; then \
		echo 'nothing answers on $(BASE_URL) — start it with `make run` (a stack on other ports: make http API_PORT=its port, STACK_DIR=its folder, as its banner says)' >&2; exit 1; \
	fi
	@if [ ! -s '$(TOKEN_FILE)' ]; then \
		echo 'no dev token in $(TOKEN_FILE) — the stack on $(BASE_URL) was started with another STACK_DIR, or not by `make run` (pass TOKEN_FILE=…)' >&2; exit 1; \
	fi
	@$(HTTPYAC) send api.http --all --var baseUrl=$(BASE_URL) --var token="$$(cat '$(TOKEN_FILE)')"

migrate: ## Apply database migrations (DATABASE_URL, or the PostgreSQL of `make run`)
	@if [ -n "$${DATABASE_URL:-}" ]; then \
		go run ./cmd/api migrate; \
	else \
		was_running=0; \
		if scripts/pg.sh status $(RUN_PG_DIR); then was_running=1; fi; \
		scripts/pg.sh start $(RUN_PG_DIR) $(RUN_PG_PORT); \
		if [ $$was_running = 0 ]; then trap 'scripts/pg.sh stop $(RUN_PG_DIR)' EXIT; fi; \
		DATABASE_URL="$$(scripts/pg.sh url $(RUN_PG_PORT))" go run ./cmd/api migrate; \
	fi

# SEED unset: the suite picks one and prints it. NOISY_PHASE: each measured
# phase of the noisy-neighbour run before the faults.
DURATION ?= 3m
NOISY_PHASE ?= 15s

faults: ## Fault suite: noisy neighbour, then crashes, restarts, network and payment-provider faults under load, then the invariant check (read models, provider ledger) (SEED=…, DURATION=3m, NOISY_PHASE=15s)
	@go run ./cmd/faults $(if $(SEED),-seed $(SEED)) -duration $(DURATION) -noisy-phase $(NOISY_PHASE)

faults-short: ## A short fault-suite run (3 s noisy-neighbour phases, 45 s of faults; part of CI)
	@go run ./cmd/faults $(if $(SEED),-seed $(SEED)) -duration 45s -every 2s -noisy-phase 3s -dir .local/faults-short

# How long `make dashboard-png` drives and scrapes its stack (not DURATION:
# that one is the fault suite's).
DASH_DURATION ?= 90s

dashboard-png: ## Redraw docs/dashboard.png from a real run: a stack in .local/dashshot (api :18180) driven and scraped for 90 s (DASH_DURATION=90s), then stopped
	@DURATION=$(DASH_DURATION) scripts/dashboard-png.sh

CLUSTER_DIR  := .local/cluster
CLUSTER_PORT := 14250

cluster: ## Start a local 3-node NATS cluster in the background and print how to run the stack on it
	@urls=$$(scripts/nats-cluster.sh start $(CLUSTER_DIR) $(CLUSTER_PORT)); \
	echo "3-node JetStream cluster up (state in $(CLUSTER_DIR); stop it with: make cluster/stop)"; \
	echo "run the stack on it:  NATS_URL=$$urls STREAM_REPLICAS=3 make run"; \
	echo "stop one node:        scripts/nats-cluster.sh stop $(CLUSTER_DIR) 1"

cluster/stop: ## Stop the local 3-node NATS cluster
	@scripts/nats-cluster.sh stop $(CLUSTER_DIR)

cluster-test: ## The pipeline on a 3-node cluster (R3), a node stopped mid-run, 3×1000 orders (make test: 3×100)
	@$(call with_test_pg,CLUSTER_ORDERS=1000 go test -count=1 -v -run 'TestThreeNodeClusterSurvivesANodeLoss' ./internal/app)

# staticcheck's default checks, plus package comments (ST1000) and doc comments
# that start with the name they document (ST1020-ST1022), as CONVENTIONS.md asks.
STATICCHECK_CHECKS := inherit,ST1000,ST1020,ST1021,ST1022

lint: ## gofmt check, go vet and staticcheck (a go tool of the module); part of CI
	@files=$$(find . -name '*.go' -not -path './.local/*' -not -path './node_modules/*' | xargs -r gofmt -l); \
	if [ -n "$$files" ]; then echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$files"; exit 1; fi
	@go vet ./...
	@go tool staticcheck -checks '$(STATICCHECK_CHECKS)' ./...

bench: ## Measure the pipeline against its pgbench ceiling in one run (own PostgreSQL and NATS); table + JSON
	@go run ./cmd/bench -phase $${PHASE:-10s}

bench/micro: ## Micro-benchmarks of the hot paths, 6 runs each, compared with the previous run by benchstat
	@mkdir -p .local/bench
	@if [ -f .local/bench/micro.txt ]; then mv .local/bench/micro.txt .local/bench/micro-old.txt; fi
	@$(call with_test_pg,go test -run '^$$' -bench . -benchmem -count 6 ./command ./domain ./httpapi ./projection | tee .local/bench/micro.txt)
	@if [ -f .local/bench/micro-old.txt ]; then go tool benchstat .local/bench/micro-old.txt .local/bench/micro.txt; \
	else go tool benchstat .local/bench/micro.txt; fi

clean: ## Stop all servers under .local and remove .local
	@if [ -d .local ]; then \
		for d in .local/*/; do \
			[ -d "$$d" ] || continue; \
			scripts/nats.sh stop "$$d" || true; \
			scripts/pg.sh wipe "$$d" || true; \
		done; \
		rm -rf .local; \
	fi
