#!/usr/bin/env bash
# Installs the web terminal's npm packages into web/node_modules, at the versions web/package-lock.json pins
# (`npm ci`): @xterm/xterm and @xterm/addon-fit, which the runtime embeds at build time
# (services/runtime/build.rs: `cargo build` stops with a message naming this script when they are missing),
# and playwright-core, which drives Debian's chromium in the web terminal's test (tests/e2e/web.rs). Nothing is
# fetched at run time: the page serves the embedded copies.
#
# Idempotent: when web/node_modules matches the lock file it only checks and returns at once. Run by
# deploy/ensure-tools.sh (make tools) and by the Makefile targets that build the runtime.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root/web"

log() { echo "ensure-web: $*" >&2; }

stamp=node_modules/.mentis-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f node_modules/@xterm/xterm/lib/xterm.js ] && [ -f node_modules/@xterm/addon-fit/lib/addon-fit.js ] &&
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { log "error: npm is missing and we are not root: install it with apt first"; exit 1; }
  log "installing Debian packages: npm"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
log "npm ci in web/ (@xterm/xterm, @xterm/addon-fit, playwright-core as web/package-lock.json pins them)"
out=$(mktemp)
if ! npm ci --no-audit --no-fund --loglevel=error >"$out" 2>&1; then
  cat "$out" >&2
  rm -f "$out"
  exit 1
fi
rm -f "$out"
echo "$want" >"$stamp"
log "installed web/node_modules"
