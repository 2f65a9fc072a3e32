#!/usr/bin/env bash
# Makes sure this machine can bound the sandboxes' disks (docs/ARCHITECTURE.md, Machines and images): each
# bounded workspace is an ext4 image (mkfs.ext4 and debugfs from e2fsprogs) on a loop device (losetup, from
# Debian's `mount` package, and /dev/loop-control). Installs what is missing; fails when the kernel offers no
# loop devices (then run the runtime with MENTIS_DISK_LIMITS=off, which bounds no disk).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

if [ "${MENTIS_DISK_LIMITS:-loop}" = off ]; then
  exit 0
fi

missing=()
command -v mkfs.ext4 >/dev/null 2>&1 || missing+=(e2fsprogs)
command -v debugfs >/dev/null 2>&1 || missing+=(e2fsprogs)
command -v losetup >/dev/null 2>&1 || missing+=(mount)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "ensure-disks: ${missing[*]} missing and we are not root; install them first" >&2
    exit 1
  fi
  echo "ensure-disks: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
fi

if [ ! -e /dev/loop-control ]; then
  modprobe loop 2>/dev/null || true
fi
if [ ! -e /dev/loop-control ]; then
  echo "ensure-disks: no loop devices here (/dev/loop-control is missing and modprobe loop did not help):" \
    "run the runtime with MENTIS_DISK_LIMITS=off (no disk limits), or load the loop module" >&2
  exit 1
fi
