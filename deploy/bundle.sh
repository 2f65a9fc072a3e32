#!/usr/bin/env bash
# Writes the offline bundle (docs/DEPLOY.md, "Offline bundle"): one tarball to install MentisSandbox on a machine
# with Docker and no registry and no network at all.
#
#   mentis-<version>/images.tar.gz       docker save of mentis/runtime, mentis/dind and mentis/executor
#   mentis-<version>/bin/                the release mentis-runtime and mentis-executor
#   mentis-<version>/compose.yaml        deploy/compose.yaml
#   mentis-<version>/helm/mentis/        the Helm chart
#   mentis-<version>/install.sh          loads the images, installs the binaries, optionally starts Compose
#   mentis-<version>/DEPLOY.md, README.md, SHA256SUMS
#
# Usage: deploy/bundle.sh [OUT_DIR]     (default target/bundle; prints the tarball's path on stdout)
# The images must exist (make service-images) and the binaries be built (cargo build --release). The
# mentis-runtime is MENTIS_BIN_DIR's (default target/release; `make test` bundles its stripped debug build).
set -euo pipefail

log() { echo "bundle: $*" >&2; }
die() { log "error: $*"; exit 1; }

start=$SECONDS
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
out_dir=$(realpath -m -- "${1:-target/bundle}")
# The runtime's own version (the workspace's), as it reports it.
runtime=${MENTIS_BIN_DIR:-target/release}/mentis-runtime
version=$("$runtime" --version 2>/dev/null | awk '{ print $2 }')
[ -n "$version" ] || die "$runtime --version failed (cargo build --release -p mentis-runtime)"
name="mentis-$version"
images=("${MENTIS_RUNTIME_IMAGE:-mentis/runtime:latest}" "${MENTIS_DIND_IMAGE:-mentis/dind:latest}"
  "${MENTIS_EXECUTOR_IMAGE:-mentis/executor:latest}")
for image in "${images[@]}"; do
  docker image inspect "$image" >/dev/null 2>&1 || die "$image is missing (make service-images)"
done
executor=target/release/mentis-executor
[ -x "$executor" ] || die "$executor is missing (make executor)"

stage=$(mktemp -d /var/tmp/mentis-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
dir="$stage/$name"
mkdir -p "$dir/bin" "$dir/helm"
install -m 0755 "$runtime" "$executor" "$dir/bin/"
install -m 0644 deploy/compose.yaml "$dir/compose.yaml"
install -m 0755 deploy/install.sh "$dir/install.sh"
install -m 0644 docs/DEPLOY.md README.md "$dir/"
cp -r helm/mentis "$dir/helm/mentis"
t=$SECONDS
log "saving ${images[*]}"
docker save "${images[@]}" | gzip -1 >"$dir/images.tar.gz"
log "images saved ($(du -h "$dir/images.tar.gz" | cut -f1), $((SECONDS - t)) s)"
printf '%s\n' "${images[@]}" >"$dir/IMAGES"
(cd "$dir" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum >SHA256SUMS)

mkdir -p "$out_dir"
tarball="$out_dir/$name.tar"
# The images are compressed already: the outer tar is not.
tar -C "$stage" -cf "$tarball.part" "$name"
mv "$tarball.part" "$tarball"
log "wrote $tarball ($(du -h "$tarball" | cut -f1)) in $((SECONDS - start)) s"
echo "$tarball"
