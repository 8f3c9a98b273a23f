#!/usr/bin/env bash
# The device machine takes the working tree only under 64 MiB (tracked files + carried paths); this repo's tracked
# files are ~62 MiB, most of it stored benchmark data that no GPU step reads. Before a `device` run:
#   bash experiments/device_tree.sh out     # moves benchmarks/results/data (~33 MiB) to $STASH (default /tmp/tuner-device-stash)
# and right after it (also when the run failed):
#   bash experiments/device_tree.sh back    # moves it back; `git status` is clean again
# Nothing is deleted: `out` refuses when a stash is already there, `back` when the folder has come back in the meantime.
# The device machine has PyTorch but not pydantic; on a fresh checkout fetch its wheels once (then `carry: [".whl"]`):
#   bash experiments/device_tree.sh wheels  # pydantic + pydantic-core + deps for the device's Python 3.12, into .whl/
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
  wheels)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
      -d .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
      && ls .whl ;;
  *) echo "usage: $0 out|back|wheels" >&2; exit 2 ;;
esac
