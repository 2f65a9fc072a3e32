#!/usr/bin/env bash
# The Python SDK's tests (sdk/python/tests, pytest) against a real runtime and real sandboxes: the wheel built by
# `make sdk` is installed into a fresh virtual environment with nothing else but pytest, as a user would install
# it, and the tests start target/debug/mentis-runtime (MENTIS_RUNTIME_BIN) on a free port of their own.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(ls target/sdk/mentis_sandbox-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "sdk-check: no wheel in target/sdk: make sdk builds it" >&2; exit 1; }
runtime=${MENTIS_RUNTIME_BIN:-target/debug/mentis-runtime}
[ -x "$runtime" ] || { echo "sdk-check: $runtime is missing: cargo build -p mentis-runtime -p mentis-cli" >&2; exit 1; }
venv=target/sdk/venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q "$wheel" pytest
MENTIS_RUNTIME_BIN=$(realpath "$runtime") "$venv/bin/python" -m pytest -q -p no:cacheprovider sdk/python/tests "$@"
