#!/usr/bin/env bash
# Builds the sandbox image: the base image plus our mentis-executor binary
# (docs/ARCHITECTURE.md, Machines and images).
#
# Why: every sandbox is one container of this image running the executor gRPC server on port 50052 as the
# unprivileged user 1000 in /workspace. No registry is reachable here, so the image is built locally on top of
# mentis/base:bookworm, which deploy/build-base-image.sh builds (or finds cached) first.
#
# The build context is a temp dir that holds only the binary, so the build takes seconds. The client is Docker 28
# with no buildx plugin and the engine is 20.10, so the legacy builder is used (DOCKER_BUILDKIT=0); its output,
# including its "legacy builder is deprecated" notice, goes to a log that is shown only when the build fails.
# The image carries the label io.mentis.executor-hash (sha256 over the binary, deploy/executor.Dockerfile, this
# script and the base image id); when the tagged image already has that hash, nothing is rebuilt.
#
# Usage: deploy/build-executor-image.sh [BINARY]     (prints the image tag on stdout, progress on stderr)
#   BINARY                default target/release/mentis-executor in the repo root (the static build `make
#                         executor` makes); a relative path given as an argument is taken from the current
#                         directory
#   MENTIS_EXECUTOR_IMAGE tag to build (default mentis/executor:latest)
set -euo pipefail

log() { echo "build-executor-image: $*" >&2; }
die() { log "error: $*"; exit 1; }

start=$SECONDS
script=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
repo_root=$(cd "$(dirname "$script")/.." && pwd)

if [ $# -gt 1 ]; then die "usage: $0 [BINARY]"; fi
if [ $# -eq 1 ]; then
  binary=$(realpath -m -- "$1")
else
  binary="$repo_root/target/release/mentis-executor"
fi
cd "$repo_root"

[ -f "$binary" ] || die "executor binary $binary is missing (build it first: cargo build --release -p mentis-executor)"
[ -x "$binary" ] || die "executor binary $binary is not executable"
# It runs in images we did not build (any libc, or none): it must need no shared library.
if ldd "$binary" 2>&1 | grep -q '=>'; then
  die "executor binary $binary is linked dynamically; build it statically (make executor)"
fi

tag=${MENTIS_EXECUTOR_IMAGE:-mentis/executor:latest}
dockerfile=deploy/executor.Dockerfile
[ -f "$dockerfile" ] || die "$dockerfile is missing"

# Builds the base image when its inputs changed; prints its hash-tagged name.
base=$(deploy/build-base-image.sh)
base_id=$(docker image inspect --format '{{.Id}}' "$base")

hash=$( { sha256sum <"$binary"; sha256sum <"$dockerfile"; sha256sum <"$script"; echo "$base_id"; } |
  sha256sum | cut -c1-12)

old_id=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
if [ -n "$old_id" ] && [ "$(docker image inspect \
  --format '{{index .Config.Labels "io.mentis.executor-hash"}}' "$tag")" = "$hash" ]; then
  log "$tag is up to date (executor hash $hash); nothing to build ($((SECONDS - start)) s)"
  echo "$tag"
  exit 0
fi

ctx=$(mktemp -d /var/tmp/mentis-executor.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
install -m 0755 "$binary" "$ctx/mentis-executor"
cp "$dockerfile" "$ctx/Dockerfile"

log "building $tag from $base with $binary ($(du -h "$binary" | cut -f1))"
t=$SECONDS
if ! DOCKER_BUILDKIT=0 docker build \
  --build-arg "BASE_IMAGE=$base" \
  --label "io.mentis.executor-hash=$hash" \
  --tag "$tag" \
  "$ctx" >"$ctx/build.log" 2>&1; then
  cat "$ctx/build.log" >&2
  die "docker build failed"
fi

# Drop the image this build replaced, unless a container or another tag still uses it (then rm refuses).
new_id=$(docker image inspect --format '{{.Id}}' "$tag")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
  docker image rm "$old_id" >/dev/null 2>&1 || true
fi

log "built $tag (executor hash $hash, $(docker image inspect --format '{{.Size}}' "$tag" |
  awk '{ printf "%.0f MB", $1 / 1e6 }')) in $((SECONDS - t)) s; total $((SECONDS - start)) s"
echo "$tag"
