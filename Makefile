# The doors of MentisSandbox. Every target does its own set-up, so each works on a fresh Debian machine (as
# root): a Docker engine is installed and started when missing, images are built locally (no registry).
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# rust-toolchain.toml's toolchain known to rustup by its name (a machine of this kind has it as stable).
_toolchain := $(shell deploy/ensure-toolchain.sh)
export MENTIS_EXECUTOR_IMAGE ?= mentis/executor:latest
TOOLS := $(CURDIR)/.tools/bin

# The runtime and the command line, always built together: cargo resolves the dependencies' features once per
# set of packages, so building them apart (or in another set) compiles every shared dependency again. The
# tests and scripts that need debug builds use the same set (tests/readme-walkthrough.sh, tests/e2e/cli.rs).
RELEASE_BINS := $(CARGO) build --release -p mentis-runtime -p mentis-cli
DEBUG_BINS := $(CARGO) build -p mentis-runtime -p mentis-cli

# The runtime and command line that the SDK's wheel, the service images and the offline bundle carry: the
# release build, or with MENTIS_BINS=debug (what `make test` sets) the debug build the tests use anyway,
# stripped of its debug information. Compiling the whole dependency tree a second time, optimised, was the
# longest step of CI (16 of its minutes on 2 cores), and the tests need not run on optimised code.
MENTIS_BINS ?= release
export MENTIS_BIN_DIR = $(CURDIR)/target/$(if $(filter debug,$(MENTIS_BINS)),debug-stripped,release)

.PHONY: help setup machine-tools tools bins web executor image service-images bundle run demo bench bench-scale soak sdk sdk-ts test test-unit test-e2e test-sdk test-deploy lint fmt clean-sandboxes

help:
	@echo "make run    - set everything up, then serve the API on 127.0.0.1:50051 (MENTIS_LISTEN)"
	@echo "make test   - set everything up, then run every test tier (unit, component, end-to-end)"
	@echo "make demo   - set everything up, start a runtime, run the README walk-through and show its output"
	@echo "make bench  - measure round trips through the whole chain (median, p95; JSON in target/bench.json)"
	@echo "make soak   - chaos soak: clients and random faults for SOAK_DURATION (30m), invariants checked (target/soak.json)"
	@echo "make lint   - cargo fmt --check, clippy -D warnings, cargo-deny (licences, duplicates, sources), buf lint and"
	@echo "              breaking, code generation in other languages, the Helm chart rendered, linted and checked against"
	@echo "              Kubernetes' schemas (offline), import cycles, detached spawns, ARCHITECTURE.md's names"
	@echo "make image  - build the base and executor images ($(MENTIS_EXECUTOR_IMAGE))"
	@echo "make sdk    - build the Python SDK's wheel (sdk/python, stubs generated from proto/) into target/sdk"
	@echo "make sdk-ts - build and pack the TypeScript SDK (sdk/typescript, code generated from proto/) into target/sdk-ts"
	@echo "make service-images - build the runtime and Docker-in-Docker images (mentis/runtime, mentis/dind; docs/DEPLOY.md)"
	@echo "make tools  - the machine tools in .tools/ and the mentis command line (target/release/mentis, docs/CLI.md)"
	@echo "make bundle - the offline bundle: images, binaries, Compose, the chart and install.sh in one tarball"

setup:
	@deploy/ensure-docker.sh
	@deploy/ensure-disks.sh

# Machine tools (.tools/), and the `mentis` command line (docs/CLI.md) in target/release (with the runtime:
# see RELEASE_BINS).
machine-tools:
	@deploy/ensure-tools.sh

tools: machine-tools web
	$(RELEASE_BINS)

# MENTIS_BIN_DIR's mentis-runtime and mentis (see MENTIS_BINS).
bins: web
ifeq ($(MENTIS_BINS),debug)
	$(DEBUG_BINS)
	@mkdir -p $(MENTIS_BIN_DIR)
	strip -o $(MENTIS_BIN_DIR)/mentis-runtime target/debug/mentis-runtime
	strip -o $(MENTIS_BIN_DIR)/mentis target/debug/mentis
else
	$(RELEASE_BINS)
endif

# The web terminal's npm packages (web/package-lock.json), which the runtime embeds when it is built.
web:
	@deploy/ensure-web.sh

# The executor runs inside the containers: a release build keeps it small and quick to start, and it is
# linked statically (glibc's crt-static), because it runs in images we did not build (docs/ARCHITECTURE.md,
# "Any image"). `cargo rustc` gives the flag to the final link only: the dependencies are the ones the other
# release builds use, not compiled a second time.
EXECUTOR_BIN := target/release/mentis-executor
executor:
	$(CARGO) rustc --release -p mentis-executor --bin mentis-executor -- -C target-feature=+crt-static

image: setup executor
	@deploy/build-executor-image.sh $(EXECUTOR_BIN)

# The runtime as a container (deploy/compose.yaml, the Helm chart): the runtime image carries the executor image.
service-images: image bins
	@deploy/build-service-images.sh $(MENTIS_BIN_DIR)/mentis-runtime

# One tarball to install from with no network (docs/DEPLOY.md): the images, the binaries, Compose, the chart.
bundle: service-images
	@deploy/bundle.sh

run: image tools
	@echo "grpcurl is in $(TOOLS): export PATH=$(TOOLS):\$$PATH"
	@echo "the mentis command line is $(CURDIR)/target/release/mentis (docs/CLI.md)"
	exec deploy/run.sh

demo: image tools
	@tests/readme-walkthrough.sh --show

# Round trips through the whole chain (median and p95), also written to target/bench.json.
bench: image tools web
	$(CARGO) run --release -p mentis-e2e --bin mentis-bench

# The runtime at scale (tests/bench/scale.rs; issue 36): bursts of creates beside `docker run`, a hundred clients
# beside `docker exec`, a thousand idle sandboxes. Takes about half an hour; SCALE_PARTS picks parts, the other
# SCALE_* knobs sizes. The runtime runs as a release process of its own.
bench-scale: image tools web
	$(CARGO) build --release -p mentis-runtime
	@# Past 512 neighbour entries (the kernel's default gc_thresh2) new executors are not reached: room for 1000.
	-sysctl -q -w net.ipv4.neigh.default.gc_thresh1=1024 net.ipv4.neigh.default.gc_thresh2=4096 \
	  net.ipv4.neigh.default.gc_thresh3=8192
	BENCH_ONLY=scale $(CARGO) run --release -p mentis-e2e --bin mentis-bench

# A chaos soak (tests/soak): SOAK_CLIENTS clients and random faults (container, executor and kernel kills,
# dropped streams, runtime SIGKILL and SIGTERM with restarts) for SOAK_DURATION; exits non-zero on any broken
# invariant. `make test` runs 4 minutes of it (the runtime's RSS levels off after about 3).
SOAK_DURATION ?= 30m
SOAK_CLIENTS ?= 20
soak: image web
	$(CARGO) build --release -p mentis-e2e --bin mentis-soak --bin mentis-runtime-under-test
	target/release/mentis-soak --duration $(SOAK_DURATION) --clients $(SOAK_CLIENTS) $(SOAK_ARGS)

# Unit and component tests need no Docker; the end-to-end tests need the engine and the image.
test-unit: web
	$(CARGO) test --workspace --exclude mentis-e2e

test-e2e: image tools
	$(CARGO) test -p mentis-e2e -- --test-threads=2

# The soak is the binary `cargo test` built: building it again with `cargo build` would resolve other features
# (no dev-dependencies) and compile most of the workspace a second time. After each part, nothing it made may
# be left on the engine (tests/leftovers.sh names what was, and fails).
test: export MENTIS_TEST_SINCE := $(shell date +%s)
test: export MENTIS_BINS := debug
test: image machine-tools web
	$(DEBUG_BINS)
	@tests/timed.sh "cargo test" $(CARGO) test --workspace --no-fail-fast -- --test-threads=2
	@tests/leftovers.sh "cargo test"
	@tests/timed.sh walkthrough tests/readme-walkthrough.sh
	@tests/timed.sh "walkthrough behind nginx" tests/readme-walkthrough.sh --behind-nginx
	@tests/leftovers.sh "the walk-throughs"
	@tests/timed.sh test-sdk $(MAKE) --no-print-directory test-sdk
	@tests/leftovers.sh test-sdk
	@tests/timed.sh test-deploy $(MAKE) --no-print-directory test-deploy
	@tests/leftovers.sh test-deploy
	@tests/timed.sh soak target/debug/mentis-soak --duration 4m --clients $(SOAK_CLIENTS)
	@tests/leftovers.sh soak

# The Python SDK: a wheel with the stubs generated from proto/ and the release runtime for embedded mode
# (docs/SDK.md).
sdk: machine-tools bins
	rm -rf target/sdk/*.whl
	MENTIS_SDK_RUNTIME_BIN=$(MENTIS_BIN_DIR)/mentis-runtime \
	  .tools/venv/bin/pip wheel -q --no-build-isolation --no-deps -w target/sdk sdk/python

# The TypeScript SDK: the npm package with the code generated from proto/ at build time (docs/SDK-TS.md).
sdk-ts:
	cd sdk/typescript && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build
	mkdir -p target/sdk-ts && rm -f target/sdk-ts/mentis-sandbox-*.tgz
	cd sdk/typescript && npm pack --silent --pack-destination ../../target/sdk-ts

# The SDK's tests (pytest) from a fresh virtual environment holding only the wheel and pytest, against a real runtime;
# then its agent-framework tools (LangGraph, CrewAI) from another one with the wheel and the pinned frameworks, and the
# MCP server (`mentis mcp` and /mcp) from a third with the wheel and the pinned Python MCP client (CrewAI needs mcp<2);
# then the TypeScript SDK's (tests/sdk-ts-check.sh).
test-sdk: image sdk
	$(DEBUG_BINS)
	@tests/timed.sh "python sdk" tests/sdk-check.sh
	@tests/timed.sh "python sdk integrations" tests/sdk-integrations-check.sh
	@tests/timed.sh "typescript sdk" tests/sdk-ts-check.sh

# The Helm chart rendered, linted and validated offline (also in make lint); the walk-through against the runtime
# image under Compose, in both modes (each also upgrades the runtime in place), then installed from the offline
# bundle on an engine without the images.
test-deploy: service-images machine-tools
	@.tools/venv/bin/python tests/helm-check.py
	@tests/readme-walkthrough.sh --compose host
	@tests/readme-walkthrough.sh --compose dind
	@tests/bundle-check.sh

# The workspace's lints (Cargo.toml) for mentis-enter, which Cargo does not build.
ENTER_LINTS := -W clippy::cast_possible_wrap -W clippy::undocumented_unsafe_blocks -W clippy::mem_forget \
  -W clippy::unimplemented -W clippy::dbg_macro -W clippy::todo -W clippy::unwrap_used

lint: machine-tools
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@# mentis-enter's root file is built by executor/build.rs, outside Cargo's targets (its logic, enter.rs, is
	@# also a module of the executor's unit tests, which the two commands above cover).
	rustfmt --edition 2024 --check executor/enter/main.rs
	clippy-driver --edition 2024 --crate-type bin -C panic=abort -D warnings $(ENTER_LINTS) --emit=metadata \
	  -o $(CURDIR)/target/mentis-enter.rmeta executor/enter/main.rs
	@# The dependency tree against deny.toml: licences, duplicate crates (warnings; `cargo-deny check bans`
	@# without --hide-inclusion-graph shows what pulls each in), sources (crates.io only).
	@# Advisories are not checked: their database cannot be fetched here (deny.toml says why).
	$(TOOLS)/cargo-deny --locked check --hide-inclusion-graph licenses bans sources
	.tools/venv/bin/ruff check sdk/python
	.tools/venv/bin/ruff format --check sdk/python
	$(TOOLS)/buf lint
	@# Compatible with the previous commit's protos (wire and generated code): a deliberate break is a
	@# commit of its own, never the last one before a CI run.
	@if git rev-parse -q --verify HEAD~1 >/dev/null; then $(TOOLS)/buf breaking --against '.git#ref=HEAD~1'; \
	  else echo "buf breaking: no previous commit to compare with"; fi
	@.tools/venv/bin/python tests/proto-codegen.py
	@# helm/mentis for several value sets: Helm's lint and render (Helm's own library), every manifest against
	@# Kubernetes 1.34's schemas (strict), bad values refused. No cluster is involved (helm/mentis/README.md).
	@.tools/venv/bin/python tests/helm-check.py
	@python3 tests/module-cycles.py proto/src services/model/src services/core/src services/gateway/src services/backend-docker/src services/telemetry/src services/store/src services/app/src services/runtime/src executor/src cli/src tests
	@# Every file and test docs/ARCHITECTURE.md names exists (a test renamed or moved leaves the text naming nothing).
	@python3 tests/arch-docs-check.py
	@# Each crate depends only on the crates its layer may use (the API never on the store or a backend).
	@python3 tests/crate-graph.py
	@# Every task on an owner (a TaskTracker or a JoinSet) and only the runtime's API naming crate::api: what
	@# exists today is listed in tests/detached-spawns.allow and tests/upward-imports.allow, which must match.
	@python3 tests/task-owners.py

fmt:
	$(CARGO) fmt --all

# Removes every container and volume any MentisSandbox runtime on this machine created, and the disk images of
# bounded workspaces with their loop devices.
# Every instance's sandboxes, pool members and gateway; `make clean-sandboxes INSTANCE=NAME` only NAME's.
clean-sandboxes:
	-@deploy/clean-sandboxes.sh $(if $(INSTANCE),--instance $(INSTANCE))
