#!/usr/bin/env bash
# After each part of `make test`: nothing a runtime or a test made since `make test` began may be left on the
# engine (docs/ARCHITECTURE.md, "Nothing leaks"). Containers and volumes with our labels (io.mentis.managed,
# io.mentis.instance, io.mentis.test-internet) made after MENTIS_TEST_SINCE (epoch seconds) are named with
# their labels, so the part that leaked them can be found, then removed; the check fails if there were any.
# What was there before `make test` (a runtime of your own on this engine, say) is not looked at.
#
# Usage: MENTIS_TEST_SINCE=EPOCH tests/leftovers.sh PART
set -euo pipefail
part=${1:?usage: tests/leftovers.sh PART}
since=${MENTIS_TEST_SINCE:?MENTIS_TEST_SINCE (epoch seconds) is not set}

# Ids (containers or volumes, by $1) with one of our labels, made after $since. The executor's volumes stay:
# every runtime of the engine shares the one of its executor image.
made_since() {
  local kind=$1 filter id created component
  for filter in label=io.mentis.managed=true label=io.mentis.instance label=io.mentis.test-internet; do
    if [ "$kind" = container ]; then
      docker ps -aq --no-trunc --filter "$filter"
    else
      docker volume ls -q --filter "$filter"
    fi
  done | sort -u | while read -r id; do
    if [ "$kind" = container ]; then
      read -r created component < <(docker inspect --format '{{.Created}} -' "$id" 2>/dev/null) || continue
    else
      read -r created component < <(docker volume inspect \
        --format '{{.CreatedAt}} {{index .Labels "io.mentis.component"}}' "$id" 2>/dev/null) || continue
    fi
    [ "$component" != executor-volume ] || continue
    if [ "$(date -d "$created" +%s)" -ge "$since" ]; then echo "$id"; fi
  done
}

containers=$(made_since container)
volumes=$(made_since volume)
if [ -z "$containers" ] && [ -z "$volumes" ]; then
  exit 0
fi
echo "leftovers: $part left these behind (removed now):" >&2
for id in $containers; do
  docker inspect --format '  container {{.Name}} ({{.Config.Image}}, {{.State.Status}}, made {{.Created}}): {{range $k, $v := .Config.Labels}}{{$k}}={{$v}} {{end}}' "$id" >&2 || true
done
for id in $volumes; do
  docker volume inspect --format '  volume {{.Name}} (made {{.CreatedAt}}): {{range $k, $v := .Labels}}{{$k}}={{$v}} {{end}}' "$id" >&2 || true
done
[ -z "$containers" ] || echo "$containers" | xargs -r docker rm -f -v >/dev/null
[ -z "$volumes" ] || echo "$volumes" | xargs -r docker volume rm -f >/dev/null
exit 1
