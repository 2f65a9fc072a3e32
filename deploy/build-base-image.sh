#!/usr/bin/env bash
# Builds a base image without any container registry (docs/ARCHITECTURE.md, Machines and images):
#   sandbox  mentis/base:bookworm          what every sandbox runs (Python, the Jupyter kernel, the data stack,
#                                          the user `sandbox` 1000:1000 owning /workspace); deploy/base-image.packages
#   service  mentis/service-base:bookworm  what the runtime image and the Docker-in-Docker image build on (Docker's
#                                          engine and CLI from Debian, iptables, e2fsprogs, tini);
#                                          deploy/service-image.packages
#
# Why: this machine (and CI) reach the Debian, PyPI, npm and crates registries but no container registry, so
# `docker pull debian` fails. We debootstrap a minimal Debian bookworm, install the flavour's packages from the
# Debian mirror inside a chroot and `docker import` the tree.
#
# The image is tagged <repo>:bookworm-<hash> and <repo>:bookworm, and labelled io.mentis.base-hash=<hash>, where
# <hash> is a short sha256 over this script and the flavour's packages file: when an image with that tag exists,
# nothing is rebuilt. The Debian mirror is read at run time from /etc/apt/sources.list.d/debian.sources.
#
# Usage: deploy/build-base-image.sh [sandbox|service]   (root; prints the hash-tagged image name on stdout,
#                                                       progress on stderr; default sandbox)
#   MENTIS_BASE_FORCE=1  rebuild even when the hash-tagged image exists
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

log() { echo "build-base-image: $*" >&2; }
die() { log "error: $*"; exit 1; }

start=$SECONDS
flavor=${1:-sandbox}
case "$flavor" in
  sandbox) packages_file=deploy/base-image.packages repo=mentis/base ;;
  service) packages_file=deploy/service-image.packages repo=mentis/service-base ;;
  *) die "unknown flavour $flavor (sandbox or service)" ;;
esac
suite=bookworm
sources=/etc/apt/sources.list.d/debian.sources

[ -f "$packages_file" ] || die "$packages_file is missing"
deploy/ensure-docker.sh

hash=$(cat deploy/build-base-image.sh "$packages_file" | sha256sum | cut -c1-12)
image="$repo:$suite-$hash"

use_cached() {
  [ "${MENTIS_BASE_FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1 || return 1
  docker tag "$image" "$repo:$suite"
  log "$image is cached (inputs unchanged); nothing to build ($((SECONDS - start)) s)"
  echo "$image"
}
use_cached && exit 0

[ "$(id -u)" = 0 ] || die "building the base image needs root (debootstrap, chroot, mount)"

# One build at a time on a machine (two make targets may ask for the image together): wait for the lock, then
# look again, since the build we waited for may have made the image.
state_dir=${MENTIS_STATE_DIR:-/var/tmp/mentis}
mkdir -p "$state_dir"
exec 9>"$state_dir/build-base-image-$flavor.lock"
flock 9
use_cached && exit 0

# Packages: strip comments and blank lines.
mapfile -t packages < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$packages_file")
[ "${#packages[@]}" -gt 0 ] || die "$packages_file lists no package"

[ -r "$sources" ] || die "$sources is missing: cannot tell which Debian mirror to use"
mirror=$(awk '/^URIs:/ { print $2; exit }' "$sources")
[ -n "$mirror" ] || die "no URIs: line in $sources"

if ! command -v debootstrap >/dev/null 2>&1; then
  log "installing debootstrap with apt"
  apt_log=$(mktemp)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap; } \
    >"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    rm -f "$apt_log"
    die "could not install debootstrap"
  fi
  rm -f "$apt_log"
fi

work=$(mktemp -d /var/tmp/mentis-base.XXXXXX)
rootfs="$work/rootfs"

cleanup() {
  local rc=$?
  # Unmount whatever is still mounted below the rootfs (deepest first), then delete the work dir without ever
  # crossing into a mount that is left (--one-file-system), so the host is never touched.
  if [ -d "$rootfs" ]; then
    awk -v r="$rootfs" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r |
      while read -r m; do umount -l "$m" || true; done
  fi
  rm -rf --one-file-system "$work" || true
  if [ "$rc" != 0 ]; then log "failed after $((SECONDS - start)) s"; fi
}
trap cleanup EXIT

# Runs a command inside the rootfs with a clean environment (nothing from the host's PATH, pyenv, etc.).
in_root() {
  chroot "$rootfs" /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}

log "building $image in $work (${#packages[@]} packages)"
t=$SECONDS
log "debootstrap --variant=minbase $suite (mirror from $sources)"
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  die "debootstrap failed"
}
log "debootstrap done ($((SECONDS - t)) s)"

# Leave documentation and message translations out of the image (as Docker's Debian images do; keep copyrights).
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/01-mentis-nodoc" <<'EOF'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*/LC_MESSAGES/*.mo
EOF
# Same apt sources as the host (main, updates and security), so the image gets the current security fixes.
rm -f "$rootfs/etc/apt/sources.list"
cp "$sources" "$rootfs/etc/apt/sources.list.d/debian.sources"
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
# No daemon may start inside the chroot while packages install.
printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
chmod 755 "$rootfs/usr/sbin/policy-rc.d"
mount -t proc proc "$rootfs/proc"

t=$SECONDS
log "apt-get install: ${packages[*]}"
{
  in_root apt-get update -q &&
    in_root apt-get -y -q upgrade &&
    in_root apt-get install -y -q --no-install-recommends "${packages[@]}"
} >"$work/apt.log" 2>&1 || {
  tail -n 40 "$work/apt.log" >&2
  die "apt-get inside the chroot failed"
}
log "packages installed ($((SECONDS - t)) s, $(in_root dpkg-query -f '.\n' -W | wc -l) packages in the image)"

if [ "$flavor" = sandbox ]; then
  log "adding user sandbox (1000:1000) and /workspace"
  in_root groupadd --gid 1000 sandbox
  in_root useradd --uid 1000 --gid 1000 --create-home --home-dir /home/sandbox --shell /bin/bash sandbox
  # A Docker named volume mounted on /workspace copies this ownership on first use.
  mkdir -p "$rootfs/workspace"
  chown 1000:1000 "$rootfs/workspace"
  chmod 755 "$rootfs/workspace"
fi

# C.UTF-8 (LANG) in a locale archive: glibc maps /usr/lib/locale/locale-archive in one go when there is one,
# and otherwise opens and maps each category's file under C.utf8/ (about 70 system calls at the start of every
# program that calls setlocale: 0.18 ms of each `bash -c`, a tenth of a shell command's round trip).
in_root localedef --add-to-archive /usr/lib/locale/C.utf8 >"$work/localedef.log" 2>&1 || {
  cat "$work/localedef.log" >&2
  die "localedef --add-to-archive failed"
}

log "cleaning up the rootfs"
umount "$rootfs/proc"
in_root apt-get clean
rm -f "$rootfs/usr/sbin/policy-rc.d"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/debconf/*-old \
  "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
  "$rootfs"/var/log/apt/* "$rootfs"/var/log/dpkg.log "$rootfs"/var/log/alternatives.log "$rootfs"/var/log/bootstrap.log \
  "$rootfs"/tmp/* "$rootfs"/var/tmp/* "$rootfs"/root/.cache
# Documentation of the packages debootstrap installed (the dpkg excludes above cover the later ones).
find "$rootfs/usr/share/doc" -mindepth 2 ! -type d ! -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
find "$rootfs/usr/share/locale" -path '*/LC_MESSAGES/*.mo' -delete
# Docker provides /etc/resolv.conf, /etc/hostname and /etc/hosts at run time.
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"
# Let the sandbox user `pip install --user` (into ~/.local, last on PATH) without --break-system-packages.
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
# No apt sources in the image: the mirror used for the build is not baked into it.
rm -f "$rootfs/etc/apt/sources.list.d/debian.sources"
printf '# %s: no apt sources are configured in this image (it is built offline from a mirror).\n' "$repo" \
  >"$rootfs/etc/apt/sources.list"

t=$SECONDS
log "docker import"
if [ "$flavor" = sandbox ]; then
  changes=(
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/home/sandbox/.local/bin'
    --change 'ENV PYTHONUNBUFFERED=1'
    --change 'ENV MPLBACKEND=Agg'
    --change 'ENV PYDEVD_DISABLE_FILE_VALIDATION=1'
    --change 'LABEL io.mentis.component=base'
  )
else
  changes=(
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    --change 'LABEL io.mentis.component=service-base'
  )
fi
tar --numeric-owner -C "$rootfs" -c . | docker import \
  "${changes[@]}" \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL io.mentis.base-hash=$hash" \
  --change 'CMD ["/bin/bash"]' \
  --message "$repo image $suite ($hash)" \
  - "$image" >/dev/null
docker tag "$image" "$repo:$suite"
log "imported ($((SECONDS - t)) s)"
rm -rf --one-file-system "$work"

# Untag the base images of earlier inputs; an image an executor image still builds on keeps its layers.
docker image ls --format '{{.Repository}}:{{.Tag}}' "$repo" |
  awk -v prefix="$repo:$suite-" -v keep="$image" 'index($0, prefix) == 1 && $0 != keep' | while read -r old; do
  log "removing the outdated $old"
  docker image rm "$old" >/dev/null 2>&1 || true
done

log "built $image, also tagged $repo:$suite ($(docker image inspect --format '{{.Size}}' "$image" |
  awk '{ printf "%.0f MB", $1 / 1e6 }')) in $((SECONDS - start)) s"
echo "$image"
