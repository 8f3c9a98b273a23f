#!/usr/bin/env bash
# The device machine takes the working tree only under 64 MiB (tracked files + carried paths); this repo's tracked
# files are ~62 MiB, most of it stored benchmark data that no GPU step reads. Before a `device` run:
#   bash experiments/device_tree.sh out     # moves benchmarks/results/data (~33 MiB) to $STASH (default /tmp/tuner-device-stash)
# and right after it (also when the run failed):
#   bash experiments/device_tree.sh back    # moves it back; `git status` is clean again
# Nothing is deleted: `out` refuses when a stash is already there, `back` when the folder has come back in the meantime.
set -eu
STASH=${STASH:-/tmp/tuner-device-stash}
DATA=benchmarks/results/data
cd "$(git rev-parse --show-toplevel)"
case "${1:-}" in
  out)
    [ -e "$STASH/data" ] && { echo "a stash is already at $STASH/data: run '$0 back' first" >&2; exit 2; }
    mkdir -p "$STASH" && mv "$DATA" "$STASH/data"
    echo "moved $DATA to $STASH/data; tracked files now $(git ls-files -z | xargs -0 stat -c %s 2>/dev/null \
      | awk '{s+=$1} END {printf "%.1f", s/1048576}') MiB" ;;
  back)
    [ -e "$DATA" ] && { echo "$DATA is already there; the stash stays at $STASH/data" >&2; exit 2; }
    [ -d "$STASH/data" ] || { echo "no stash at $STASH/data" >&2; exit 2; }
    mv "$STASH/data" "$DATA" && echo "moved $DATA back" ;;
  *) echo "usage: $0 out|back" >&2; exit 2 ;;
esac
