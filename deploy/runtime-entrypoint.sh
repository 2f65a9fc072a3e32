#!/bin/sh
# The runtime image's entrypoint: waits for the Docker engine the runtime is given (DOCKER_HOST, or the socket
# mounted at /var/run/docker.sock), loads the executor image it carries into that engine when the engine lacks
# it or has another build of it (compared by the io.mentis.executor-hash label), then execs mentis-runtime.
# Any argument (`healthcheck`, `--version`) goes straight to mentis-runtime.
set -eu

if [ "$#" -gt 0 ]; then
  exec /usr/local/bin/mentis-runtime "$@"
fi

log() { echo "mentis-runtime-entrypoint: $*" >&2; }
image=${MENTIS_EXECUTOR_IMAGE:-mentis/executor:latest}
tarball=/usr/share/mentis/executor-image.tar.gz
wait_secs=${MENTIS_ENGINE_WAIT_SECS:-60}

i=0
until docker version >/dev/null 2>&1; do
  i=$((i + 1))
  if [ "$i" -gt "$wait_secs" ]; then
    log "no Docker engine answered within ${wait_secs} s (DOCKER_HOST=${DOCKER_HOST:-unset}):"
    docker version >&2 || true
    exit 1
  fi
  sleep 1
done

if [ -f "$tarball" ]; then
  want=$(cat /usr/share/mentis/executor-image.hash 2>/dev/null || true)
  have=$(docker image inspect --format '{{index .Config.Labels "io.mentis.executor-hash"}}' "$image" 2>/dev/null || true)
  if [ -z "$have" ] || [ "$have" != "$want" ]; then
    log "loading $image (executor hash ${want:-unknown}) into the engine"
    docker load --quiet <"$tarball" >&2
  fi
fi
exec /usr/local/bin/mentis-runtime
