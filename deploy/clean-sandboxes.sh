#!/usr/bin/env bash
# Removes what MentisSandbox runtimes on this machine created and left behind when they stopped
# (`make clean-sandboxes`): sandbox and warm-pool containers, workspace volumes, the disk images of bounded workspaces with their loop devices, and the gateway's network with its
# netfilter chains. A stop leaves them on purpose: the next runtime of the same instance (MENTIS_INSTANCE)
# takes its sandboxes and pool members over (docs/SANDBOXES.md, "What outlives a stop").
#
#   deploy/clean-sandboxes.sh                    every instance's
#   deploy/clean-sandboxes.sh --instance NAME    only instance NAME's (`make clean-sandboxes INSTANCE=NAME`)
#
# The instance's runtime should be stopped first: a running one would see its sandboxes vanish. The
# executor networks, which every instance shares, stay.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

filter=label=io.mentis.managed=true
scope="every instance's"
case ${1:-} in
  --instance)
    [ -n "${2:-}" ] || { echo "clean-sandboxes: --instance needs a name" >&2; exit 2; }
    filter=label=io.mentis.instance=$2
    scope="instance $2's"
    ;;
  "") ;;
  *) echo "usage: clean-sandboxes.sh [--instance NAME]" >&2; exit 2 ;;
esac

containers=$(docker ps -aq --filter "$filter")
[ -z "$containers" ] || echo "$containers" | xargs -r docker rm -f -v >/dev/null
volumes=$(docker volume ls -q --filter "$filter")
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
# The gateway's networks (one per instance, labelled with it), and the chains of their bridges (MGW-<bridge>
# in the nat and filter tables, and the jumps to them).
networks=$(docker network ls -q --filter "$filter" --filter label=io.mentis.instance)
for network in $networks; do
  bridge=$(docker network inspect --format '{{index .Options "com.docker.network.bridge.name"}}' "$network" 2>/dev/null || true)
  if [ -z "$bridge" ] || [ "$bridge" = "<no value>" ]; then
    bridge=br-$(docker network inspect --format '{{.Id}}' "$network" 2>/dev/null | cut -c1-12)
  fi
  docker network rm "$network" >/dev/null 2>&1 || true
  chain=MGW-$bridge
  if command -v iptables >/dev/null; then
    for table in nat filter; do
      # The jumps of the bridge's traffic to the chain, and the DROP of what it would forward.
      iptables -t "$table" -S 2>/dev/null | grep -E -- "^-A .*-i $bridge .*-j ($chain|DROP)\$" | sed 's/^-A /-D /' |
        while read -r rule; do
          # shellcheck disable=SC2086 # a rule as iptables -S printed it: its words are iptables' arguments
          iptables -t "$table" $rule 2>/dev/null || true
        done
      iptables -t "$table" -F "$chain" 2>/dev/null && iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  fi
done
echo "clean-sandboxes: removed $scope $(echo "$containers" | grep -c . || true) containers, $(echo "$volumes" | grep -c . || true) volumes, ${#images[@]} disk images, $(echo "$networks" | grep -c . || true) networks" >&2
