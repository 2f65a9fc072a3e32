#!/usr/bin/env bash
# Makes sure a Docker engine answers on this machine (docs/ARCHITECTURE.md, Machines and images).
# A fresh Debian machine has the docker client but no engine: install Debian's docker.io when dockerd is
# missing, start dockerd in the background with a log file, and wait until `docker info` answers.
set -euo pipefail

log_dir=${MENTIS_STATE_DIR:-/var/tmp/mentis}
mkdir -p "$log_dir"

if docker info >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "ensure-docker: dockerd is missing and we are not root; install docker.io first" >&2
    exit 1
  fi
  echo "ensure-docker: installing Debian's docker.io" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker.io >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "ensure-docker: starting dockerd (log: $log_dir/dockerd.log)" >&2
  # setsid: dockerd must outlive the shell (and the make target) that started it.
  setsid nohup dockerd >"$log_dir/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    if docker info >/dev/null 2>&1; then break; fi
    sleep 0.5
  done
fi

if ! docker info >/dev/null 2>&1; then
  echo "ensure-docker: dockerd did not answer within 60 s; last log lines:" >&2
  tail -n 30 "$log_dir/dockerd.log" >&2 || true
  exit 1
fi
echo "ensure-docker: engine $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')" >&2
