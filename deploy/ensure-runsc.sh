#!/usr/bin/env bash
# Makes sure the Docker engine lists gVisor's runtime `runsc`, registered so that sandboxes keep their network
# (docs/ARCHITECTURE.md, Machines and images). Idempotent; needs root for apt, /etc/docker/daemon.json and
# reloading dockerd.
#
# Debian's runsc (2022) cannot run its own network stack (`--network=sandbox`, the default) on current kernels:
# it takes the container's network namespace for the host's, because `net.core.rmem_default` is per
# namespace there now, and refuses to start. `--network=host` works: gVisor then passes socket calls to the
# host kernel *inside the container's own network namespace* (Docker's bridge, ICC rules and the internal
# network still apply), so the control plane reaches the executor as with runc and egress works.
# Everything else (files, processes, /proc, syscalls) stays behind gVisor's kernel.
set -euo pipefail
cd "$(dirname "$0")"

name=runsc
args='["--network=host"]'
config=/etc/docker/daemon.json

./ensure-docker.sh

registered() {
  docker info --format '{{json .Runtimes}}' 2>/dev/null |
    jq -e --arg n "$name" --argjson a "$args" '.[$n].runtimeArgs == $a' >/dev/null 2>&1
}

if command -v jq >/dev/null 2>&1 && command -v runsc >/dev/null 2>&1 && registered; then
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "ensure-runsc: runtime $name is not registered and we are not root" >&2
  exit 1
fi

if ! command -v runsc >/dev/null 2>&1 || ! command -v jq >/dev/null 2>&1; then
  echo "ensure-runsc: installing Debian's runsc" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends runsc jq >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends runsc jq >/dev/null
  fi
fi

# Merge into the daemon's config, keeping every other key (and other runtimes) as they are.
mkdir -p "$(dirname "$config")"
current='{}'
if [ -s "$config" ]; then current=$(cat "$config"); fi
if jq -e --arg n "$name" '.runtimes[$n] != null' <<<"$current" >/dev/null; then
  echo "ensure-runsc: replacing the existing runtime $name in $config (it needs $args)" >&2
fi
jq --arg n "$name" --arg p "$(command -v runsc)" --argjson a "$args" \
  '.runtimes[$n] = {path: $p, runtimeArgs: $a}' <<<"$current" >"$config.mentis-tmp"
mv "$config.mentis-tmp" "$config"

# `runtimes` is one of the settings dockerd reloads on SIGHUP: no restart, running containers are untouched.
kill -HUP "$(pidof dockerd)"
for _ in $(seq 1 50); do
  if registered; then
    echo "ensure-runsc: Docker runtime $name registered ($(runsc --version | head -n1))" >&2
    exit 0
  fi
  sleep 0.2
done
echo "ensure-runsc: dockerd did not pick up runtime $name from $config" >&2
exit 1
