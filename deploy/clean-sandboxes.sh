#!/usr/bin/env bash
# Removes every container and workspace volume any MentisSandbox runtime on this machine created, and the
# disk images of bounded workspaces with their loop devices (`make clean-sandboxes`). Runtimes should be
# stopped first: a running one would see its sandboxes vanish.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

docker ps -aq --filter label=io.mentis.managed=true | xargs -r docker rm -f -v >/dev/null
volumes=$(docker volume ls -q --filter label=io.mentis.managed=true)
images=()
for volume in $volumes; do
  image=$(docker volume inspect --format '{{index .Labels "io.mentis.disk-image"}}' "$volume" 2>/dev/null || true)
  if [ -n "$image" ] && [ "$image" != "<no value>" ]; then
    images+=("$image")
  fi
done
if [ -n "$volumes" ]; then
  echo "$volumes" | xargs -r docker volume rm -f >/dev/null
fi
for image in "${images[@]}"; do
  for device in $(losetup --list --noheadings --output NAME --associated "$image" 2>/dev/null); do
    losetup -d "$device" || true
  done
  rm -f "$image" "${image%.ext4}.dev"
done
echo "clean-sandboxes: removed $(echo "$volumes" | grep -c . || true) volumes, ${#images[@]} disk images" >&2
