#!/usr/bin/env bash
# Runs the README's grpcurl walk-through exactly as written (the block between the walkthrough markers)
# against a freshly started mentis-runtime on 127.0.0.1:50051, and checks what it printed. This keeps the
# front door honest: if the README's commands stop working, `make test` fails. With --show (`make demo`) it
# also prints what the walk-through printed.
set -euo pipefail
show=${1:-}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
export PATH=$repo/.tools/bin:$PATH
work=$(mktemp -d)
instance="readme-$$"
runtime_pid=
cleanup() {
  if [ -n "$runtime_pid" ]; then kill "$runtime_pid" 2>/dev/null || true; wait "$runtime_pid" 2>/dev/null || true; fi
  docker ps -aq --filter "label=io.mentis.instance=$instance" | xargs -r docker rm -f -v >/dev/null
  docker volume ls -q --filter "label=io.mentis.instance=$instance" | xargs -r docker volume rm -f >/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

if grpcurl -plaintext -max-time 1 127.0.0.1:50051 list >/dev/null 2>&1; then
  echo "readme-walkthrough: something already serves on 127.0.0.1:50051; stop it first" >&2
  exit 1
fi
cargo build -q -p mentis-runtime
MENTIS_INSTANCE=$instance MENTIS_DATA_DIR=$work/data RUST_LOG=warn target/debug/mentis-runtime >"$work/runtime.log" 2>&1 &
runtime_pid=$!
for _ in $(seq 1 100); do
  grpcurl -plaintext -max-time 1 127.0.0.1:50051 grpc.health.v1.Health/Check >/dev/null 2>&1 && break
  kill -0 "$runtime_pid" 2>/dev/null || { cat "$work/runtime.log" >&2; exit 1; }
  sleep 0.2
done

# The README reads the admin key from the data folder; blocks after the first get $AUTH from here.
export MENTIS_DATA_DIR=$work/data
export AUTH="authorization: Bearer $(cat "$MENTIS_DATA_DIR/admin.key")"
sed -n '/<!-- walkthrough:begin -->/,/<!-- walkthrough:end -->/p' README.md | sed '/^```/d; /^<!--/d' >"$work/walk.sh"
if ! bash -euo pipefail "$work/walk.sh" >"$work/out" 2>&1; then
  echo "readme-walkthrough: the README's commands failed:" >&2
  cat "$work/out" "$work/runtime.log" >&2
  exit 1
fi
sed -n '/<!-- python:begin -->/,/<!-- python:end -->/p' README.md | sed '/^```/d; /^<!--/d' >"$work/python.sh"
if ! bash -euo pipefail "$work/python.sh" >"$work/python.out" 2>&1; then
  echo "readme-walkthrough: the README's Python client failed:" >&2
  cat "$work/python.out" "$work/runtime.log" >&2
  exit 1
fi
cat "$work/python.out" >>"$work/out"
sed -n '/<!-- lifecycle:begin -->/,/<!-- lifecycle:end -->/p' README.md | sed '/^```/d; /^<!--/d' >"$work/lifecycle.sh"
if ! bash -euo pipefail "$work/lifecycle.sh" >"$work/lifecycle.out" 2>&1; then
  echo "readme-walkthrough: the README's lifecycle commands failed:" >&2
  cat "$work/lifecycle.out" "$work/runtime.log" >&2
  exit 1
fi
cat "$work/lifecycle.out" >>"$work/out"
sed -n '/<!-- keys:begin -->/,/<!-- keys:end -->/p' README.md | sed '/^```/d; /^<!--/d' >"$work/keys.sh"
if ! bash -euo pipefail "$work/keys.sh" >"$work/keys.out" 2>&1; then
  echo "readme-walkthrough: the README's key commands failed:" >&2
  cat "$work/keys.out" "$work/runtime.log" >&2
  exit 1
fi
cat "$work/keys.out" >>"$work/out"
grep -qE "team b's sandbox: [0-9a-z-]{8,}" "$work/keys.out" || { echo "readme-walkthrough: keys: no sandbox for team b" >&2; cat "$work/keys.out" >&2; exit 1; }
for want in 'Code: PermissionDenied' 'Code: Unauthenticated' '"revokeTime"'; do
  grep -qF -- "$want" "$work/keys.out" || { echo "readme-walkthrough: keys: output lacks $want" >&2; cat "$work/keys.out" >&2; exit 1; }
done
[ "$(grep -c 'Code: Unauthenticated' "$work/keys.out")" = 2 ] ||
  { echo "readme-walkthrough: keys: expected Unauthenticated twice (no key, revoked key)" >&2; cat "$work/keys.out" >&2; exit 1; }
{
  echo 'SANDBOX=$(grpcurl -plaintext -H "$AUTH" -d "{}" 127.0.0.1:50051 mentis.v1.SandboxService/CreateSandbox | jq -r .sandbox.sandboxId)'
  sed -n '/<!-- files:begin -->/,/<!-- files:end -->/p' README.md | sed '/^```/d; /^<!--/d'
  echo 'grpcurl -plaintext -H "$AUTH" -d "{\"sandbox_id\": \"$SANDBOX\", \"path\": \"notes/hello.txt\"}" 127.0.0.1:50051 mentis.v1.FileService/ReadFile | jq -r .data | base64 -d'
  echo 'grpcurl -plaintext -H "$AUTH" -d "{\"sandbox_id\": \"$SANDBOX\"}" 127.0.0.1:50051 mentis.v1.SandboxService/DeleteSandbox'
} >"$work/files.sh"
if ! bash -euo pipefail "$work/files.sh" >"$work/files.out" 2>&1; then
  echo "readme-walkthrough: the README's file commands failed:" >&2
  cat "$work/files.out" "$work/runtime.log" >&2
  exit 1
fi
cat "$work/files.out" >>"$work/out"
[ "$(grep -c '^SANDBOX_STATE_RUNNING$' "$work/lifecycle.out")" = 2 ] ||
  { echo "readme-walkthrough: lifecycle: expected RUNNING twice" >&2; cat "$work/lifecycle.out" >&2; exit 1; }
fail=0
for want in 'mentis.v1.SandboxService' 'mentis.v1.ActionService' 'grpc.health.v1.Health' \
  'grpc.reflection.v1alpha.ServerReflection' '"cmdStart"' 'aGVsbG8K' 'd29ybGQK' '"exitCode": 3' \
  'END_REASON_EXITED' '"ipythonResult"' 'IPYTHON_STATUS_OK' '"text/html"' 'sum 10' '"shape"' \
  'cell 2 IPYTHON_STATUS_OK' '"spaceId": "team-a"' 'same sandbox for chat-1234' 'SANDBOX_STATE_PAUSED' \
  'chat-1234 20' 'hello files' 'goodbye files' 'src/main.py'; do
  grep -qF -- "$want" "$work/out" || { echo "readme-walkthrough: output lacks $want" >&2; fail=1; }
done
if grep -qF mentis.executor "$work/out"; then echo "readme-walkthrough: reflection shows the internal API" >&2; fail=1; fi
[ "$(grep -c '"cmdEnd"' "$work/out")" = 1 ] || { echo "readme-walkthrough: expected exactly one cmdEnd" >&2; fail=1; }
if [ -n "$(docker ps -aq --filter "label=io.mentis.instance=$instance")" ]; then
  echo "readme-walkthrough: DeleteSandbox left a container behind" >&2; fail=1
fi
if [ "$fail" != 0 ]; then cat "$work/out" >&2; exit 1; fi
if [ "$show" = --show ]; then cat "$work/out"; fi
echo "readme-walkthrough: 1 passed, 0 failed"
