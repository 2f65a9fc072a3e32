#!/usr/bin/env bash
# The SDK's agent-framework tools and the MCP server (sdk/python/tests_integrations, pytest) against a real
# runtime and real sandboxes. The wheel (MENTIS_SDK_WHEEL, else the one `make sdk` built in target/sdk) is
# installed into two fresh virtual environments: one with the pinned frameworks of
# sdk/python/tests_integrations/requirements.txt (LangGraph, LangChain, CrewAI), one with the pinned MCP client of
# requirements-mcp.txt for test_mcp.py (CrewAI requires mcp<2, the MCP tests the current mcp 2.x). The tests
# start MENTIS_RUNTIME_BIN (target/debug/mentis-runtime) on a free port of their own; `mentis mcp` is
# MENTIS_CLI_BIN (target/debug/mentis). No model service is used, nor any network beyond the package index for
# the installation: the chat models are scripted, and CrewAI's telemetry and tracing are off.
# Arguments go to both pytest runs (e.g. -k mcp); with arguments, a run they select no test of is fine as long
# as the other ran tests.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=${MENTIS_SDK_WHEEL:-$(ls target/sdk/mentis_sandbox-*.whl 2>/dev/null | head -n 1)}
[ -n "$wheel" ] && [ -f "$wheel" ] || { echo "sdk-integrations-check: no wheel (${wheel:-target/sdk}): make sdk builds it" >&2; exit 1; }
runtime=${MENTIS_RUNTIME_BIN:-target/debug/mentis-runtime}
[ -x "$runtime" ] || { echo "sdk-integrations-check: $runtime is missing: cargo build -p mentis-runtime -p mentis-cli" >&2; exit 1; }
cli=${MENTIS_CLI_BIN:-target/debug/mentis}
[ -x "$cli" ] || { echo "sdk-integrations-check: $cli is missing: cargo build -p mentis-runtime -p mentis-cli" >&2; exit 1; }
tests=sdk/python/tests_integrations
frameworks=target/sdk/venv-integrations
mcp=target/sdk/venv-mcp
rm -rf "$frameworks" "$mcp"
started=$SECONDS
python3 -m venv "$frameworks"
"$frameworks/bin/pip" install -q "$wheel" -r "$tests/requirements.txt"
python3 -m venv "$mcp"
"$mcp/bin/pip" install -q "$wheel" -r "$tests/requirements-mcp.txt"
echo "sdk-integrations-check: installed the wheel and the pinned packages in $((SECONDS - started)) s"
# CrewAI writes a key and settings under $HOME when imported: a home of the run's own keeps the user's clean.
home=$(mktemp -d -t mentis-integrations-home.XXXXXX)
trap 'rm -rf "$home"' EXIT
unset LANGSMITH_TRACING LANGCHAIN_TRACING_V2 LANGSMITH_API_KEY LANGCHAIN_API_KEY OPENAI_API_KEY
run() {
  local venv=$1
  shift
  HOME=$home CREWAI_DISABLE_TELEMETRY=true CREWAI_TRACING_ENABLED=false OTEL_SDK_DISABLED=true \
    MENTIS_RUNTIME_BIN=$(realpath "$runtime") MENTIS_CLI_BIN=$(realpath "$cli") \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
}
set +e
run "$frameworks" "$tests" --ignore="$tests/test_mcp.py" "$@"
frameworks_rc=$?
run "$mcp" "$tests/test_mcp.py" "$@"
mcp_rc=$?
set -e
# pytest's 5: no test selected.
case "$#:$frameworks_rc:$mcp_rc" in
  *:0:0) exit 0 ;;
  [1-9]*:5:0 | [1-9]*:0:5) exit 0 ;;
esac
echo "sdk-integrations-check: the frameworks' tests exited $frameworks_rc, the MCP tests $mcp_rc" >&2
exit 1
