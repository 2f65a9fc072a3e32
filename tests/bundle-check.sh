#!/usr/bin/env bash
# The offline bundle, installed as on a machine that never saw this repository's images: makes the bundle
# (deploy/bundle.sh), removes the three images from the engine, unpacks the bundle, installs it (./install.sh:
# checksums, docker load, binaries into a scratch folder), and runs the README's walk-through against the
# bundle's compose.yaml in host mode (tests/readme-walkthrough.sh --compose host, with the upgrade check).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
log() { echo "bundle-check: $*" >&2; }
die() { log "error: $*"; exit 1; }

tarball=$(deploy/bundle.sh)
work=$(mktemp -d /var/tmp/mentis-bundle-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
images=(mentis/runtime:latest mentis/dind:latest mentis/executor:latest)
log "removing ${images[*]} from the engine"
docker image rm "${images[@]}" >/dev/null
for image in "${images[@]}"; do
  if docker image inspect "$image" >/dev/null 2>&1; then die "$image is still there"; fi
done
tar -C "$work" -xf "$tarball"
dir=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'mentis-*')
[ -x "$dir/install.sh" ] || die "no install.sh in $tarball"
"$dir/install.sh" --bin-dir "$work/bin"
for image in "${images[@]}"; do
  docker image inspect "$image" >/dev/null 2>&1 || die "$image is missing after the install"
done
"$work/bin/mentis-runtime" --version | grep -q '^mentis-runtime ' || die "the installed mentis-runtime does not run"
MENTIS_COMPOSE_FILE="$dir/compose.yaml" tests/readme-walkthrough.sh --compose host
log "1 passed, 0 failed ($(du -h "$tarball" | cut -f1) bundle)"
