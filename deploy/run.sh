#!/usr/bin/env bash
# The runtime as `make run` starts it (and the README walk-through, so that the defaults it shows are tested):
# the API on MENTIS_LISTEN (127.0.0.1:50051), and the HTTP listener (previews, the web terminal, /mcp) on
# 127.0.0.1:8080 unless MENTIS_HTTP_LISTEN says otherwise; MENTIS_HTTP_LISTEN= (empty) turns it off. The
# runtime's own default is no HTTP listener: this script's is for one machine, on loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${MENTIS_RUNTIME_BIN:-target/release/mentis-runtime}
export MENTIS_HTTP_LISTEN=${MENTIS_HTTP_LISTEN-127.0.0.1:8080}
[ -n "$MENTIS_HTTP_LISTEN" ] && echo "run: previews, the web terminal and /mcp on http://$MENTIS_HTTP_LISTEN (MENTIS_HTTP_LISTEN)" >&2
exec "$bin" "$@"
