#!/usr/bin/env bash
# The TypeScript SDK (sdk/typescript; docs/SDK-TS.md) against a real runtime and real sandboxes:
#  1. `npm ci` at the versions package-lock.json pins, then `npm run build`: the messages and service descriptors
#     generated from proto/ by protobuf-es, and the package compiled (tsc, strict);
#  2. its tests (node --test, one test file at a time: each starts MENTIS_RUNTIME_BIN, target/debug/mentis-runtime,
#     on a free port of its own);
#  3. the package as a user gets it: `npm pack` into target/sdk-ts, installed into a fresh folder with the README's
#     own commands, and the README's TypeScript quick start compiled and run there as written (in embedded mode:
#     no MENTIS_ADDR, the runtime named by MENTIS_RUNTIME_BIN).
# Arguments go to node --test (e.g. --test-name-pattern=terminal); TS_TESTS names test files (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
runtime=${MENTIS_RUNTIME_BIN:-target/debug/mentis-runtime}
[ -x "$runtime" ] || { echo "sdk-ts-check: $runtime is missing: cargo build -p mentis-runtime -p mentis-cli" >&2; exit 1; }
runtime=$(realpath "$runtime")
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[ "$major" -ge 20 ] || { echo "sdk-ts-check: the TypeScript SDK needs Node.js 20 or later (found: ${major/#0/none})" >&2; exit 1; }

cd sdk/typescript
npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
npm run --silent build:test
files=${TS_TESTS:-$(ls build/test/*.test.js)}
MENTIS_RUNTIME_BIN=$runtime node --test --test-concurrency=1 --test-reporter=spec "$@" $files

[ -z "${TS_TESTS:-}" ] || exit 0
# The package as a user installs it, and the README's quick start as written.
mkdir -p "$root/target/sdk-ts"
rm -f "$root"/target/sdk-ts/mentis-sandbox-*.tgz
npm pack --silent --pack-destination "$root/target/sdk-ts" >/dev/null
cd "$root"
source tests/blocks.sh
install=$(block README.md sdk-ts-install)
quickstart=$(block README.md sdk-ts)
fresh=$(mktemp -d /tmp/mentis-ts-quickstart-XXXXXX)
trap 'rm -rf "$fresh"' EXIT
# The install block names /tmp/mentis-ts; here it is a fresh folder of this run's own.
install=${install//\/tmp\/mentis-ts/$fresh}
printf '%s\n' "$quickstart" >"$fresh/quickstart.ts.in"
out=$(env -u MENTIS_ADDR -u MENTIS_API_KEY MENTIS_RUNTIME_BIN="$runtime" bash -euo pipefail -c "{
$install
} >/dev/null
cp $fresh/quickstart.ts.in quickstart.ts
$(block README.md sdk-ts-run)")
expected=$'3\n42'
if [ "$out" != "$expected" ]; then
  printf 'sdk-ts-check: the quick start printed:\n%s\nnot:\n%s\n' "$out" "$expected" >&2
  exit 1
fi
echo "sdk-ts-check: the packed package installed into a fresh folder, and the README's quick start printed 3 and 42"
