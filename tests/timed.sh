#!/usr/bin/env bash
# Runs a command and says on stderr how long it took: `make test` times each of its parts with it, so a CI log
# shows where its minutes go. Exits with the command's status.
name=$1
shift
start=$(date +%s)
status=0
"$@" || status=$?
echo "timed: $name took $(( $(date +%s) - start )) s (exit $status)" >&2
exit "$status"
