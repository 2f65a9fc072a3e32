#!/usr/bin/env bash
# The toolchain rust-toolchain.toml names, as rustup knows it by that name. A machine of this project's kind
# has one Rust toolchain (stable) and rustup reaches no server: when the pinned version is the stable one
# installed but rustup has no toolchain of that name, it is linked to it; when stable is another version,
# this says so (cargo would then fail trying to download the pinned one). Runs before any cargo command of the
# Makefile; prints nothing when there is nothing to do.
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
[ -n "$want" ] || exit 0
command -v rustup >/dev/null || exit 0
if rustup toolchain list | grep -q "^$want[-\ ]"; then
  exit 0
fi
stable=$(RUSTUP_TOOLCHAIN=stable rustc --version 2>/dev/null | awk '{print $2}')
if [ "$stable" = "$want" ]; then
  # `rustup toolchain link` takes no version-like name: the toolchain folder gets a second name instead.
  sysroot=$(RUSTUP_TOOLCHAIN=stable rustc --print sysroot)
  host=$(RUSTUP_TOOLCHAIN=stable rustc -vV | sed -n 's/^host: //p')
  ln -sfn "$sysroot" "$(dirname "$sysroot")/$want-$host"
  echo "ensure-toolchain: rustup's stable ($stable) is also $want-$host now (rust-toolchain.toml)" >&2
else
  echo "ensure-toolchain: rust-toolchain.toml pins $want, but this machine's stable is ${stable:-missing}" >&2
fi
