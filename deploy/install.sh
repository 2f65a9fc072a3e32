#!/usr/bin/env bash
# Installs MentisSandbox from its offline bundle (this folder, unpacked from mentis-<version>.tar): checks the
# files, loads the images into the local Docker engine, installs the binaries, and optionally starts Compose.
# Needs no network and no registry. docs/DEPLOY.md ("Offline bundle") beside this script says more.
#
# Usage: ./install.sh [--bin-dir DIR] [--start host|dind]
#   --bin-dir DIR    where mentis-runtime and mentis-executor go (default /usr/local/bin; "none" to skip)
#   --start MODE     then start the runtime with Compose in that mode (MENTIS_DATA_DIR, default /var/lib/mentis)
set -euo pipefail

log() { echo "install: $*" >&2; }
die() { log "error: $*"; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin_dir=/usr/local/bin
start=
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin_dir=${2:?--bin-dir needs a folder}; shift ;;
    --start)
      case ${2:-} in host | dind) start=$2 ;; *) die "--start host|dind" ;; esac
      shift ;;
    -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done

cd "$here"
log "checking the bundle's files"
sha256sum --quiet -c SHA256SUMS || die "the bundle is damaged (SHA256SUMS does not match)"
docker version >/dev/null 2>&1 || die "no Docker engine answers (start dockerd, or set DOCKER_HOST)"

log "loading the images ($(du -h images.tar.gz | cut -f1))"
docker load -i images.tar.gz >&2
while read -r image; do
  docker image inspect "$image" >/dev/null 2>&1 || die "$image is not in the engine after the load"
done <IMAGES

if [ "$bin_dir" != none ]; then
  install -d "$bin_dir"
  install -m 0755 bin/mentis-runtime bin/mentis-executor "$bin_dir/"
  log "installed mentis-runtime and mentis-executor in $bin_dir"
fi

if [ -n "$start" ]; then
  command -v docker-compose >/dev/null 2>&1 || die "docker-compose is missing (Debian: apt install docker-compose)"
  export MENTIS_DATA_DIR=${MENTIS_DATA_DIR:-/var/lib/mentis}
  mkdir -p "$MENTIS_DATA_DIR"
  docker-compose -p "${MENTIS_COMPOSE_PROJECT:-mentis}" -f compose.yaml --profile "$start" up -d >&2
  log "started in $start mode: the API is on 127.0.0.1:50051, the admin key in $MENTIS_DATA_DIR/admin.key"
fi
log "done"
