#!/bin/sh
# Starts dockerd for the runtime: on its Unix socket (shared with the runtime through a volume at
# /var/run/mentis-dind) and, when MENTIS_DIND_TCP is set (e.g. 127.0.0.1:2375, for a pod whose containers share
# the network namespace), on that TCP address. Never expose the TCP address beyond the pod or the host: the
# engine's API is root on this container.
set -eu
mkdir -p /var/run/mentis-dind
set -- --host=unix:///var/run/mentis-dind/docker.sock --host=unix:///var/run/docker.sock
if [ -n "${MENTIS_DIND_TCP:-}" ]; then
  set -- "$@" --host="tcp://${MENTIS_DIND_TCP}"
fi
# cgroup v2 nesting: move this shell out of the root cgroup, so dockerd may enable controllers for its
# children (the same dance as Docker's own dind script).
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mkdir -p /sys/fs/cgroup/init
  xargs -rn1 </sys/fs/cgroup/cgroup.procs >/sys/fs/cgroup/init/cgroup.procs 2>/dev/null || true
  sed -e 's/ / +/g' -e 's/^/+/' </sys/fs/cgroup/cgroup.controllers >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
fi
exec dockerd "$@" ${MENTIS_DIND_ARGS:-}
