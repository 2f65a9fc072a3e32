#!/usr/bin/env bash
# The SDK's agent-framework tools and the MCP server (sdk/python/tests_integrations, pytest) against a real
# runtime and real sandboxes: the wheel (MENTIS_SDK_WHEEL, else the one `make sdk` built in target/sdk) is
# installed into a fresh virtual environment with the pinned packages of sdk/python/tests_integrations/
# requirements.txt (LangGraph, LangChain, CrewAI, the MCP client), and the tests start MENTIS_RUNTIME_BIN
# (target/debug/mentis-runtime) on a free port of their own; `mentis mcp` is MENTIS_CLI_BIN (target/debug/mentis).
# No model service is used, nor any network beyond the package index for the installation: the chat models are
# scripted, and CrewAI's telemetry and tracing are off.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=${MENTIS_SDK_WHEEL:-$(ls target/sdk/mentis_sandbox-*.whl 2>/dev/null | head -n 1)}
[ -n "$wheel" ] && [ -f "$wheel" ] || { echo "sdk-integrations-check: no wheel (${wheel:-target/sdk}): make sdk builds it" >&2; exit 1; }
runtime=${MENTIS_RUNTIME_BIN:-target/debug/mentis-runtime}
[ -x "$runtime" ] || { echo "sdk-integrations-check: $runtime is missing: cargo build -p mentis-runtime -p mentis-cli" >&2; exit 1; }
cli=${MENTIS_CLI_BIN:-target/debug/mentis}
[ -x "$cli" ] || { echo "sdk-integrations-check: $cli is missing: cargo build -p mentis-runtime -p mentis-cli" >&2; exit 1; }
venv=target/sdk/venv-integrations
rm -rf "$venv"
python3 -m venv "$venv"
started=$SECONDS
"$venv/bin/pip" install -q "$wheel" -r sdk/python/tests_integrations/requirements.txt
echo "sdk-integrations-check: installed the wheel and the pinned packages in $((SECONDS - started)) s"
# CrewAI writes a key and settings under $HOME when imported: a home of the run's own keeps the user's clean.
home=$(mktemp -d -t mentis-integrations-home.XXXXXX)
trap 'rm -rf "$home"' EXIT
unset LANGSMITH_TRACING LANGCHAIN_TRACING_V2 LANGSMITH_API_KEY LANGCHAIN_API_KEY OPENAI_API_KEY
HOME=$home CREWAI_DISABLE_TELEMETRY=true CREWAI_TRACING_ENABLED=false OTEL_SDK_DISABLED=true \
  MENTIS_RUNTIME_BIN=$(realpath "$runtime") MENTIS_CLI_BIN=$(realpath "$cli") \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider sdk/python/tests_integrations "$@"
