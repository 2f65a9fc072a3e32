#!/usr/bin/env bash
# Runs the README's grpcurl walk-through and the guides' marked blocks (docs/*.md) exactly as written
# against a freshly started mentis-runtime on 127.0.0.1:50051, and checks what they printed. This keeps the
# front door honest: if the documented commands stop working, `make test` fails. With --show (`make demo`) it
# also prints what the walk-through printed. With --behind-nginx the runtime serves on 127.0.0.1:50052 and
# Debian's nginx, with the settings block of docs/PROXY.md, passes gRPC to it from 127.0.0.1:50051 (HTTP/2
# without TLS, so the README's commands run unchanged; tests/e2e/proxy.rs covers nginx with TLS).
# With --compose host or --compose dind the runtime is the runtime image started by deploy/compose.yaml in that
# mode (docs/DEPLOY.md), and after the walk-through the runtime is upgraded in place (another image, the same
# data folder): it must take its sandbox over.
set -euo pipefail
show=
behind_nginx=
compose=
while [ $# -gt 0 ]; do
  case $1 in
    --show) show=--show ;;
    --behind-nginx) behind_nginx=1 ;;
    --compose)
      shift
      case ${1:-} in host | dind) compose=$1 ;; *) echo "readme-walkthrough: --compose host|dind" >&2; exit 2 ;; esac ;;
    *) echo "readme-walkthrough: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
export PATH=$repo/.tools/bin:$PATH
work=$(mktemp -d)
instance="readme-$$"
runtime_pid=
nginx_pid=
project="mentis-readme-$$"
# MENTIS_COMPOSE_FILE: another copy of deploy/compose.yaml (the offline bundle's, tests/bundle-check.sh).
dc() {
  MENTIS_DATA_DIR=$work/data MENTIS_INSTANCE=$instance \
    docker-compose -p "$project" -f "${MENTIS_COMPOSE_FILE:-deploy/compose.yaml}" --profile "$compose" "$@"
}
# Sandbox containers of this run: in the host's engine, or in the Docker-in-Docker engine.
sandboxes_left() {
  if [ "$compose" = dind ]; then
    dc exec -T dind docker ps -aq --filter "label=io.mentis.instance=$instance" 2>/dev/null || true
  else
    docker ps -aq --filter "label=io.mentis.instance=$instance"
  fi
}
cleanup() {
  if [ -n "$compose" ]; then
    if [ "${keep_logs:-}" = 1 ]; then dc logs --no-color >&2 || true; fi
    # Down first (dind takes its sandboxes with it), then what a host-mode runtime left in the host's engine.
    dc down -v --remove-orphans >/dev/null 2>&1 || true
    docker image rm mentis/runtime:readme-upgrade >/dev/null 2>&1 || true
  fi
  if [ -n "$nginx_pid" ]; then kill "$nginx_pid" 2>/dev/null || true; wait "$nginx_pid" 2>/dev/null || true; fi
  if [ -n "$runtime_pid" ]; then kill "$runtime_pid" 2>/dev/null || true; wait "$runtime_pid" 2>/dev/null || true; fi
  docker ps -aq --filter "label=io.mentis.instance=$instance" | xargs -r docker rm -f -v >/dev/null
  docker volume ls -q --filter "label=io.mentis.instance=$instance" | xargs -r docker volume rm -f >/dev/null
  # The egress guide's test internet, and the egress gateway's network.
  docker ps -aq --filter "label=io.mentis.test-internet=$instance" | xargs -r docker rm -f >/dev/null
  for label in test-internet instance; do
    docker network ls -q --filter "label=io.mentis.$label=$instance" | xargs -r docker network rm >/dev/null 2>&1 || true
  done
  loops_under "$work" | xargs -r -n1 losetup -d 2>/dev/null || true
  rm -rf "$work"
  # Whatever stopped the sandboxes' containers (DeleteSandbox, the runtime container and a dind engine going
  # down, the removals above), no workspace's loop device may outlive them: the kernel frees each with its
  # container's mount. Devices a runtime in a container attached name the image by the path it saw, so
  # they are told by their image's name.
  local stranded=
  for _ in $(seq 1 50); do
    stranded=$(comm -13 <(printf '%s\n' "$workspace_loops_before") <(workspace_loops))
    [ -z "$stranded" ] && break
    sleep 0.2
  done
  if [ -n "$stranded" ]; then
    echo "readme-walkthrough: loop devices of workspaces outlived their sandboxes: $stranded" >&2
    exit 1
  fi
}
# Attached loop devices whose image is a workspace's (mentis-ws-<id>.ext4), sorted.
workspace_loops() {
  PATH="$PATH:/usr/sbin:/sbin" losetup --list --noheadings --output NAME,BACK-FILE 2>/dev/null |
    awk '$2 ~ /\/mentis-ws-[^/]*\.ext4$/ {print $1}' | sort
}
workspace_loops_before=$(workspace_loops)
# Loop devices whose disk image lies under $1 (bounded workspaces of this run's runtime).
loops_under() {
  PATH="$PATH:/usr/sbin:/sbin" losetup --list --noheadings --output NAME,BACK-FILE 2>/dev/null |
    awk -v dir="$1/" 'index($2, dir) == 1 {print $1}'
}
trap cleanup EXIT

if grpcurl -plaintext -max-time 1 127.0.0.1:50051 list >/dev/null 2>&1; then
  echo "readme-walkthrough: something already serves on 127.0.0.1:50051; stop it first" >&2
  exit 1
fi
listen=127.0.0.1:50051
# The runtime, and the command line that the blocks building images use (`mentis template build`), as the
# README says. Always the two together, as `make test` and the e2e tests build them: cargo resolves the
# dependencies' features per set of packages, so another set would compile them all again.
cargo build -q -p mentis-runtime -p mentis-cli
export PATH=$repo/target/debug:$PATH
if [ -n "$behind_nginx" ]; then
  listen=127.0.0.1:50052
  if grpcurl -plaintext -max-time 1 "$listen" list >/dev/null 2>&1; then
    echo "readme-walkthrough: something already serves on $listen; stop it first" >&2
    exit 1
  fi
  nginx=$(command -v nginx || echo /usr/sbin/nginx)
  [ -x "$nginx" ] || { echo "readme-walkthrough: nginx is missing: make tools installs it" >&2; exit 1; }
  mkdir -p "$work/nginx"
  settings=$(sed -n '/^# mentis-proxy-settings$/,/^```/p' docs/PROXY.md | sed '/^```/d')
  grep -q grpc_read_timeout <<<"$settings" || { echo "readme-walkthrough: no settings block in docs/PROXY.md" >&2; exit 1; }
  cat >"$work/nginx/nginx.conf" <<CONF
daemon off;
user root;
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events {}
http {
    access_log off;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    server {
        listen 127.0.0.1:50051 http2;
$settings
        location / {
            grpc_pass grpc://$listen;
        }
    }
}
CONF
  "$nginx" -c "$work/nginx/nginx.conf" -p "$work/nginx" 2>"$work/nginx/stderr" &
  nginx_pid=$!
fi
# The egress guide's internet (docs/EGRESS.md, there is no other here): api.example.test, an HTTPS server
# with a certificate from a test CA the runtime's egress gateway is told to trust (MENTIS_EGRESS_CA_FILES),
# on a network of its own, named for the gateway by MENTIS_EGRESS_HOSTS. It answers "authorized" when the
# space's token arrives in Authorization, else "unauthorized".
internet_ip=
internet_up() {
  local d=$work/internet
  mkdir -p "$d"
  (
    cd "$d"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=walkthrough-ca \
      -keyout ca.key -out ca.pem
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=api.example.test \
      -addext subjectAltName=DNS:api.example.test -keyout key.pem -out req.pem
    openssl x509 -req -in req.pem -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -copy_extensions copy -out cert.pem
  ) >"$d/openssl.log" 2>&1 || { cat "$d/openssl.log" >&2; exit 1; }
  cat >"$d/server.py" <<'PY'
import http.server, ssl
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == "Bearer tok-3141"
        body = b"authorized\n" if ok else b"unauthorized\n"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
s = http.server.ThreadingHTTPServer(("0.0.0.0", 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/srv/cert.pem", "/srv/key.pem")
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print("serving", flush=True)
s.serve_forever()
PY
  chmod 755 "$d"; chmod 644 "$d"/*
  # Its own label: it is no sandbox (the checks below count this instance's containers).
  docker network create --label "io.mentis.test-internet=$instance" "mentis-readme-internet-$instance" >/dev/null
  docker run -d --label "io.mentis.test-internet=$instance" --network "mentis-readme-internet-$instance" \
    -v "$d:/srv:ro" --entrypoint python3 mentis/executor:latest /srv/server.py >/dev/null
  local c
  c=$(docker ps -q --filter "label=io.mentis.test-internet=$instance")
  for _ in $(seq 1 100); do docker logs "$c" 2>&1 | grep -q serving && break; sleep 0.1; done
  internet_ip=$(docker inspect --format "{{(index .NetworkSettings.Networks \"mentis-readme-internet-$instance\").IPAddress}}" "$c")
  [ -n "$internet_ip" ] || { echo "readme-walkthrough: the egress guide's server has no address" >&2; exit 1; }
}
if [ -n "$compose" ]; then
  command -v docker-compose >/dev/null || { echo "readme-walkthrough: docker-compose is missing: make tools installs it" >&2; exit 1; }
  for image in mentis/runtime:latest mentis/dind:latest; do
    docker image inspect "$image" >/dev/null 2>&1 ||
      { echo "readme-walkthrough: $image is missing: make service-images builds it" >&2; exit 1; }
  done
  mkdir -p "$work/data"
  dc up -d >"$work/runtime.log" 2>&1 || { cat "$work/runtime.log" >&2; keep_logs=1; exit 1; }
  # The first start of dind loads the executor image into a fresh engine: allow for it.
  up=
  for _ in $(seq 1 600); do
    if grpcurl -plaintext -max-time 1 127.0.0.1:50051 grpc.health.v1.Health/Check >/dev/null 2>&1; then up=1; break; fi
    sleep 0.5
  done
  [ -n "$up" ] || { echo "readme-walkthrough: the compose runtime ($compose) did not serve within 5 minutes" >&2; keep_logs=1; exit 1; }
  # The image's own HEALTHCHECK (mentis-runtime healthcheck) says healthy too.
  runtime_service=runtime; [ "$compose" = dind ] && runtime_service=runtime-dind
  for _ in $(seq 1 60); do
    health=$(docker inspect --format '{{.State.Health.Status}}' "$(dc ps -q "$runtime_service")")
    [ "$health" = healthy ] && break
    sleep 1
  done
  [ "$health" = healthy ] || { echo "readme-walkthrough: the runtime container is $health, not healthy" >&2; keep_logs=1; exit 1; }
else
  internet_up
  MENTIS_EGRESS_HOSTS=api.example.test=$internet_ip MENTIS_EGRESS_CA_FILES=$work/internet/ca.pem \
    MENTIS_METRICS_LISTEN=127.0.0.1:9464 MENTIS_LISTEN=$listen MENTIS_INSTANCE=$instance MENTIS_DATA_DIR=$work/data \
    RUST_LOG=warn,mentis_gateway=trace,mentis_app::sandboxes::egress=trace MENTIS_RUNTIME_BIN=target/debug/mentis-runtime \
    env -u MENTIS_HTTP_LISTEN deploy/run.sh >"$work/runtime.log" 2>&1 &
  runtime_pid=$!
  for _ in $(seq 1 100); do
    grpcurl -plaintext -max-time 1 127.0.0.1:50051 grpc.health.v1.Health/Check >/dev/null 2>&1 && break
    kill -0 "$runtime_pid" 2>/dev/null || { cat "$work/runtime.log" >&2; exit 1; }
    if [ -n "$nginx_pid" ]; then kill -0 "$nginx_pid" 2>/dev/null || { cat "$work/nginx/stderr" >&2; exit 1; }; fi
    sleep 0.2
  done
fi

# The README reads the admin key from the data folder; blocks after the first get $AUTH from here.
export MENTIS_DATA_DIR=$work/data
export AUTH="authorization: Bearer $(cat "$MENTIS_DATA_DIR/admin.key")"
# block FILE NAME: a marked block of a document.
source "$(dirname "${BASH_SOURCE[0]}")/blocks.sh"
# Runs block NAME of FILE (README.md or a guide in docs/), between an optional prelude and epilogue, and
# appends what it printed to $work/out.
run_block() {
  local file=$1 name=$2 prelude=${3:-} epilogue=${4:-}
  block "$file" "$name" >"$work/$name.code" || exit 1
  grep -q . "$work/$name.code" || { echo "readme-walkthrough: the $name block of $file is empty" >&2; exit 1; }
  {
    printf '%s\n' "$prelude"
    cat "$work/$name.code"
    printf '%s\n' "$epilogue"
  } >"$work/$name.sh"
  if ! bash -euo pipefail "$work/$name.sh" >"$work/$name.out" 2>&1; then
    echo "readme-walkthrough: the $name block of $file failed:" >&2
    cat "$work/$name.out" "$work/runtime.log" >&2
    exit 1
  fi
  cat "$work/$name.out" >>"$work/out"
}
: >"$work/out"
run_block README.md walkthrough
run_block docs/API.md python
run_block docs/SANDBOXES.md lifecycle
run_block docs/SECURITY.md keys
run_block docs/SECURITY.md limits
run_block docs/OBSERVABILITY.md observability
run_block docs/TERMINALS.md terminals
run_block docs/SNAPSHOTS.md snapshots
run_block docs/SNAPSHOTS.md snapshot-policy
run_block docs/PREVIEW.md preview
run_block docs/SANDBOXES.md own-image
run_block docs/SANDBOXES.md templates
if [ -z "$compose" ]; then
  run_block README.md security
  run_block docs/EGRESS.md egress
  for want in authorized 'curl: (6) Could not resolve host: example.com' 0; do
    grep -qxF -- "$want" "$work/security.out" ||
      { echo "readme-walkthrough: security: output lacks $want" >&2; cat "$work/security.out" >&2; exit 1; }
  done
  for want in 'curl: (6) Could not resolve host: api.example.test' api.example.test authorized 'no token here' \
    'dns api.example.test: no rule allows api.example.test'; do
    grep -qxF -- "$want" "$work/egress.out" ||
      { echo "readme-walkthrough: egress: output lacks $want" >&2; cat "$work/egress.out" >&2; exit 1; }
  done
  # The token is in no line of the runtime's log, with the gateway's own at their most verbose (whose
  # start is there: the control that the log was written).
  grep -qF 'egress gateway started' "$work/runtime.log" ||
    { echo "readme-walkthrough: egress: the runtime's log lacks the gateway's start" >&2; exit 1; }
  if grep -qF tok-3141 "$work/runtime.log"; then
    echo "readme-walkthrough: egress: the secret is in the runtime's log" >&2; exit 1
  fi
else
  # The guide's internet is a container on the host's engine, which a runtime in Compose cannot be told
  # about here; the block runs in the plain and nginx modes of the same `make test`.
  echo "readme-walkthrough: the egress blocks (README.md security, docs/EGRESS.md egress) run in the plain modes, not under Compose ($compose)"
fi
run_block docs/FILES.md files \
  'SANDBOX=$(grpcurl -plaintext -H "$AUTH" -d "{}" 127.0.0.1:50051 mentis.v1.SandboxService/CreateSandbox | jq -r .sandbox.sandboxId)' \
  'grpcurl -plaintext -H "$AUTH" -d "{\"sandbox_id\": \"$SANDBOX\", \"path\": \"notes/hello.txt\"}" 127.0.0.1:50051 mentis.v1.FileService/ReadFile | jq -r .data | base64 -d
grpcurl -plaintext -H "$AUTH" -d "{\"sandbox_id\": \"$SANDBOX\"}" 127.0.0.1:50051 mentis.v1.SandboxService/DeleteSandbox'

for want in my/tools:1 1000 'UNKNOWN:1000' mentis-executor tini \
  'IPython cells need python3 with the ipykernel module, and this image has no python3 on its PATH' \
  'Code: FailedPrecondition' 'Message: image "my/not-built:1" is not on this engine'; do
  grep -qF -- "$want" "$work/own-image.out" ||
    { echo "readme-walkthrough: own-image: output lacks $want" >&2; cat "$work/own-image.out" >&2; exit 1; }
done
for want in /workspace/project prepared Agg 'data 1024'; do
  grep -qxF -- "$want" "$work/templates.out" ||
    { echo "readme-walkthrough: templates: output lacks $want" >&2; cat "$work/templates.out" >&2; exit 1; }
done
keys_fail() { echo "readme-walkthrough: keys: $1" >&2; cat "$work/keys.out" >&2; exit 1; }
grep -qE "team b's sandbox: [0-9a-z-]{8,}" "$work/keys.out" || keys_fail "no sandbox for team b"
for want in 'Code: PermissionDenied' '"revokeTime"'; do
  grep -qF -- "$want" "$work/keys.out" || keys_fail "output lacks $want"
done
[ "$(grep -c 'Code: Unauthenticated' "$work/keys.out")" = 2 ] || keys_fail "expected Unauthenticated twice (no key, revoked key)"
for want in 'Code: InvalidArgument' '512' '256' 'ROOT_FILESYSTEM_READ_ONLY' '"diskLimitMb":"64"' \
  'CapEff:	0000000000000000' 'read-only root' 'writable workspace and tmp' 'No space left on device' \
  'workspace full'; do
  grep -qF -- "$want" "$work/limits.out" ||
    { echo "readme-walkthrough: limits: output lacks $want" >&2; cat "$work/limits.out" >&2; exit 1; }
done
[ "$(grep -c '^1000$' "$work/limits.out")" = 1 ] ||
  { echo "readme-walkthrough: limits: expected uid 1000" >&2; cat "$work/limits.out" >&2; exit 1; }
for want in traced 'mentis_actions_ended_total{kind="shell",reason="Exited"' \
  'mentis_sandbox_creates_total{outcome="ok",path="cold"'; do
  grep -qF -- "$want" "$work/observability.out" ||
    { echo "readme-walkthrough: observability: output lacks $want" >&2; cat "$work/observability.out" >&2; exit 1; }
done
grep -qx 1 "$work/observability.out" ||
  { echo "readme-walkthrough: observability: no memory figure for the sandbox" >&2; cat "$work/observability.out" >&2; exit 1; }
for want in 'kept from the first sandbox' '"conversation": "chat-1234"' '"store": "local"'; do
  grep -qF -- "$want" "$work/snapshots.out" ||
    { echo "readme-walkthrough: snapshots: output lacks $want" >&2; cat "$work/snapshots.out" >&2; exit 1; }
done
grep -qx 'SANDBOX_STATE_RUNNING' "$work/snapshot-policy.out" ||
  { echo "readme-walkthrough: snapshot-policy: no sandbox came back" >&2; cat "$work/snapshot-policy.out" >&2; exit 1; }
grep -qF '<h1>hello from the sandbox</h1>' "$work/preview.out" && [ "$(grep -cx 401 "$work/preview.out")" = 2 ] ||
  { echo "readme-walkthrough: preview: expected the page, then 401 twice" >&2; cat "$work/preview.out" >&2; exit 1; }
for want in 'hello from /tmp' '/dev/pts/' '30 100'; do
  grep -qF -- "$want" "$work/terminals.out" ||
    { echo "readme-walkthrough: terminals: output lacks $want" >&2; cat "$work/terminals.out" >&2; exit 1; }
done
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
if [ -n "$(sandboxes_left)" ]; then
  echo "readme-walkthrough: DeleteSandbox left a container behind" >&2; fail=1
fi
if [ -n "$(loops_under "$work")" ]; then
  echo "readme-walkthrough: DeleteSandbox left a loop device behind: $(loops_under "$work")" >&2; fail=1
fi
if [ "$fail" != 0 ]; then cat "$work/out" >&2; exit 1; fi

if [ -n "$compose" ]; then
  # An upgrade in place: another runtime image (a new tag of the same build), the same data folder. The new
  # runtime takes the sandbox over: its file, and the kernel's state, are still there.
  g() { grpcurl -plaintext -H "$AUTH" "$@"; }
  SANDBOX=$(g -d '{}' 127.0.0.1:50051 mentis.v1.SandboxService/CreateSandbox | jq -r .sandbox.sandboxId)
  g -d "{\"sandbox_id\": \"$SANDBOX\", \"action\": {\"shell\": {\"command\": \"echo before > kept.txt\"}}}" \
    127.0.0.1:50051 mentis.v1.ActionService/Execute >/dev/null
  g -d "{\"sandbox_id\": \"$SANDBOX\", \"action\": {\"ipython\": {\"code\": \"kept = 41\"}}}" \
    127.0.0.1:50051 mentis.v1.ActionService/Execute >/dev/null
  if [ "$compose" = dind ]; then
    # Its sandboxes are the dind engine's containers, apart from the host's.
    [ -z "$(docker ps -aq --filter "label=io.mentis.instance=$instance")" ] ||
      { echo "readme-walkthrough: a dind-mode sandbox is in the host's engine" >&2; exit 1; }
    [ -n "$(sandboxes_left)" ] || { echo "readme-walkthrough: the dind engine lists no sandbox" >&2; exit 1; }
  fi
  old_container=$(dc ps -q "$runtime_service")
  docker tag mentis/runtime:latest mentis/runtime:readme-upgrade
  MENTIS_RUNTIME_IMAGE=mentis/runtime:readme-upgrade dc up -d >>"$work/runtime.log" 2>&1 ||
    { echo "readme-walkthrough: the upgrade did not start" >&2; keep_logs=1; exit 1; }
  [ "$(MENTIS_RUNTIME_IMAGE=mentis/runtime:readme-upgrade dc ps -q "$runtime_service")" != "$old_container" ] ||
    { echo "readme-walkthrough: the upgrade kept the old container" >&2; exit 1; }
  for _ in $(seq 1 120); do
    grpcurl -plaintext -max-time 1 127.0.0.1:50051 grpc.health.v1.Health/Check 2>/dev/null | grep -q SERVING && break
    sleep 0.5
  done
  after=$(g -d "{\"sandbox_id\": \"$SANDBOX\", \"action\": {\"ipython\": {\"code\": \"print(open('kept.txt').read().strip(), kept + 1)\"}}}" \
    127.0.0.1:50051 mentis.v1.ActionService/Execute)
  grep -qF '"text": "before 42' <<<"$after" ||
    { echo "readme-walkthrough: after the upgrade the sandbox lost its file or its kernel: $after" >&2; keep_logs=1; exit 1; }
  # The web terminal is on (MENTIS_HTTP_LISTEN, 127.0.0.1:8080): a link minted over the API opens its page.
  link=$(g -d "{\"sandbox_id\": \"$SANDBOX\"}" 127.0.0.1:50051 mentis.v1.TerminalService/CreateTerminalLink | jq -r .path)
  case $link in /terminal#token=*) ;; *) echo "readme-walkthrough: CreateTerminalLink gave $link" >&2; exit 1 ;; esac
  curl -sf "http://127.0.0.1:8080${link%%#*}" | grep -q xterm ||
    { echo "readme-walkthrough: the web terminal's page is not on 127.0.0.1:8080" >&2; keep_logs=1; exit 1; }
  g -d "{\"sandbox_id\": \"$SANDBOX\"}" 127.0.0.1:50051 mentis.v1.SandboxService/DeleteSandbox >/dev/null
  echo "readme-walkthrough: the upgraded runtime took its sandbox over; the web terminal's page is served"
fi
if [ "$show" = --show ]; then cat "$work/out"; fi
echo "readme-walkthrough${behind_nginx:+ (behind nginx)}${compose:+ (compose, $compose mode)}: 1 passed, 0 failed"
