#!/usr/bin/env bash
# Builds the images that run MentisSandbox as containers (docs/DEPLOY.md), locally (no registry):
#   mentis/runtime:latest  the runtime binary, its entrypoint, and the executor image as a tarball it loads into
#                          the engine it is given (deploy/runtime.Dockerfile)
#   mentis/dind:latest     Debian's dockerd, for the Docker-in-Docker mode (deploy/dind.Dockerfile)
# both on mentis/service-base:bookworm (deploy/build-base-image.sh service). The executor image must exist
# (make image). Each image carries a hash label over its inputs; when it matches, nothing is rebuilt.
#
# Usage: deploy/build-service-images.sh [RUNTIME_BINARY]   (default target/release/mentis-runtime; prints the
#                                                          two tags on stdout, progress on stderr)
#   MENTIS_RUNTIME_IMAGE (mentis/runtime:latest), MENTIS_DIND_IMAGE (mentis/dind:latest),
#   MENTIS_EXECUTOR_IMAGE (mentis/executor:latest)
set -euo pipefail

log() { echo "build-service-images: $*" >&2; }
die() { log "error: $*"; exit 1; }

start=$SECONDS
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
binary=$(realpath -m -- "${1:-$repo_root/target/release/mentis-runtime}")
cd "$repo_root"
[ -x "$binary" ] || die "runtime binary $binary is missing (cargo build --release -p mentis-runtime)"

runtime_tag=${MENTIS_RUNTIME_IMAGE:-mentis/runtime:latest}
dind_tag=${MENTIS_DIND_IMAGE:-mentis/dind:latest}
executor_tag=${MENTIS_EXECUTOR_IMAGE:-mentis/executor:latest}
executor_hash=$(docker image inspect --format '{{index .Config.Labels "io.mentis.executor-hash"}}' "$executor_tag" \
  2>/dev/null) || die "the executor image $executor_tag is missing (make image)"

base=$(deploy/build-base-image.sh service)
base_id=$(docker image inspect --format '{{.Id}}' "$base")

# build TAG DOCKERFILE HASH LABEL FILES...: builds TAG from a context holding FILES unless TAG has HASH.
build() {
  local tag=$1 dockerfile=$2 hash=$3 label=$4
  shift 4
  if [ "$(docker image inspect --format "{{index .Config.Labels \"$label\"}}" "$tag" 2>/dev/null)" = "$hash" ]; then
    log "$tag is up to date ($label $hash)"
    return
  fi
  local ctx old_id t=$SECONDS
  ctx=$(mktemp -d /var/tmp/mentis-service-image.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$ctx'" RETURN
  cp "$dockerfile" "$ctx/Dockerfile"
  local f
  for f in "$@"; do cp -p "$f" "$ctx/"; done
  if [ "$tag" = "$runtime_tag" ]; then
    log "saving $executor_tag into the runtime image's context"
    docker save "$executor_tag" | gzip -1 >"$ctx/executor-image.tar.gz"
    echo "$executor_hash" >"$ctx/executor-image.hash"
  fi
  old_id=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  # The legacy builder (no buildx plugin here); its log is shown only when the build fails.
  if ! DOCKER_BUILDKIT=0 docker build --build-arg "BASE_IMAGE=$base" --label "$label=$hash" --tag "$tag" \
    "$ctx" >"$ctx/build.log" 2>&1; then
    cat "$ctx/build.log" >&2
    die "docker build of $tag failed"
  fi
  if [ -n "$old_id" ] && [ "$old_id" != "$(docker image inspect --format '{{.Id}}' "$tag")" ]; then
    docker image rm "$old_id" >/dev/null 2>&1 || true
  fi
  log "built $tag ($(docker image inspect --format '{{.Size}}' "$tag" | awk '{ printf "%.0f MB", $1 / 1e6 }'), \
$((SECONDS - t)) s)"
}

runtime_hash=$( { sha256sum <"$binary"; sha256sum deploy/runtime.Dockerfile deploy/runtime-entrypoint.sh \
  deploy/build-service-images.sh; echo "$executor_hash $base_id"; } | sha256sum | cut -c1-12)
dind_hash=$( { sha256sum deploy/dind.Dockerfile deploy/dind-entrypoint.sh; echo "$base_id"; } |
  sha256sum | cut -c1-12)

tmp_bin=$(mktemp -d /var/tmp/mentis-runtime-bin.XXXXXX)
trap 'rm -rf "$tmp_bin"' EXIT
install -m 0755 "$binary" "$tmp_bin/mentis-runtime"
install -m 0755 deploy/runtime-entrypoint.sh "$tmp_bin/runtime-entrypoint.sh"
install -m 0755 deploy/dind-entrypoint.sh "$tmp_bin/dind-entrypoint.sh"

build "$runtime_tag" deploy/runtime.Dockerfile "$runtime_hash" io.mentis.runtime-hash \
  "$tmp_bin/mentis-runtime" "$tmp_bin/runtime-entrypoint.sh"
build "$dind_tag" deploy/dind.Dockerfile "$dind_hash" io.mentis.dind-hash "$tmp_bin/dind-entrypoint.sh"
log "done in $((SECONDS - start)) s"
echo "$runtime_tag"
echo "$dind_tag"
