#!/usr/bin/env bash
# Builds the images the "any image" end-to-end tests run sandboxes of (tests/e2e/images.rs), from local
# material only (no registry): images that know nothing of MentisSandbox, and images that cannot run a
# sandbox.
#
#   mentis-test/busybox:1            busybox alone (Debian's busybox-static): sh, no bash, no python, no user
#   mentis-test/debian-no-python:1   Debian (the base image) with every Python package purged, and neither the
#                                    user `sandbox` nor /workspace
#   mentis-test/python-no-ipykernel:1  Debian with python3 and without ipykernel, no user, no /workspace
#   mentis-test/no-shell:1           a file and nothing else: no /bin/sh
#   mentis-test/arm64:1              an image built for another architecture
#
# Each image is labelled io.mentis.test-image=<hash> over this script and the base image's id, and rebuilt
# only when that changes. One build at a time on a machine (tests ask for the images from several threads).
# Usage: tests/images/build.sh      (root; prints the image names on stdout, progress on stderr)
set -euo pipefail

log() { echo "test-images: $*" >&2; }
die() { log "error: $*"; exit 1; }

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo_root"
state_dir=${MENTIS_STATE_DIR:-/var/tmp/mentis}
mkdir -p "$state_dir"
exec 9>"$state_dir/test-images.lock"
flock 9

base=$(deploy/build-base-image.sh)
hash=$( { sha256sum <tests/images/build.sh; docker image inspect --format '{{.Id}}' "$base"; } | sha256sum | cut -c1-12)

current() {
  [ "$(docker image inspect --format '{{index .Config.Labels "io.mentis.test-image"}}' "$1" 2>/dev/null)" = "$hash" ]
}

work=$(mktemp -d /var/tmp/mentis-test-images.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Builds $1 from the Dockerfile on stdin (context: $work/ctx), with the legacy builder (no buildx here).
build() {
  local tag=$1; shift
  current "$tag" && { echo "$tag"; return; }
  docker image rm "$tag" >/dev/null 2>&1 || true
  rm -rf "$work/ctx" && mkdir -p "$work/ctx"
  cat >"$work/ctx/Dockerfile"
  echo "made for the MentisSandbox tests" >"$work/ctx/README"
  log "building $tag"
  DOCKER_BUILDKIT=0 docker build "$@" --build-arg "BASE=$base" --label "io.mentis.test-image=$hash" \
    -t "$tag" "$work/ctx" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; die "building $tag failed"; }
  echo "$tag"
}

# busybox: Debian's static build and a link per applet, imported as the whole root filesystem.
tag=mentis-test/busybox:1
if current "$tag"; then
  echo "$tag"
else
  log "building $tag from Debian's busybox-static"
  (cd "$work" && { apt-get download busybox-static >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get download busybox-static >/dev/null; }; }) ||
    die "cannot download busybox-static with apt"
  dpkg-deb -x "$work"/busybox-static_*.deb "$work/deb"
  root="$work/root"
  mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/proc" "$root/sys" "$root/dev"
  chmod 1777 "$root/tmp"
  install -m 0755 "$work/deb/bin/busybox" "$root/bin/busybox"
  for applet in $("$root/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
  done
  tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' --change "LABEL io.mentis.test-image=$hash" \
    - "$tag" >/dev/null
  echo "$tag"
fi

# What a foreign Debian image lacks of ours: the user `sandbox` and /workspace.
build mentis-test/debian-no-python:1 <<'DOCKERFILE'
ARG BASE
FROM ${BASE}
USER root
RUN apt-get purge -y -q --auto-remove python3 python3-minimal >/dev/null && ! command -v python3 \
 && userdel -r sandbox && rm -rf /workspace
WORKDIR /
DOCKERFILE

build mentis-test/python-no-ipykernel:1 <<'DOCKERFILE'
ARG BASE
FROM ${BASE}
USER root
RUN apt-get purge -y -q python3-ipykernel >/dev/null && python3 -c 'import sys' \
 && ! python3 -c 'import ipykernel' 2>/dev/null && userdel -r sandbox && rm -rf /workspace
WORKDIR /
DOCKERFILE

build mentis-test/no-shell:1 <<'DOCKERFILE'
FROM scratch
COPY README /README
DOCKERFILE

# --no-cache: the builder's cache does not tell platforms apart, and would hand back the image above.
build mentis-test/arm64:1 --platform linux/arm64 --no-cache <<'DOCKERFILE'
FROM scratch
COPY README /README.arm64
DOCKERFILE
