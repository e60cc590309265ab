#!/bin/sh
# The image's install steps, in one place so that a test can run exactly them
# (no container engine exists where the tests run).
#   install.sh build   SRC WHEELS   build stage: wheels of the project and of its deps at
#                                   the versions and hashes of SRC/requirements/runtime.txt
#   install.sh runtime WHEELS       final stage: install from those wheels only
set -eu
case "${1:-}" in
  build)
    python -m pip wheel --no-cache-dir --require-hashes --wheel-dir "$3" -r "$2/requirements/runtime.txt"
    python -m pip wheel --no-cache-dir --no-deps --wheel-dir "$3" "$2"
    ;;
  runtime)
    python -m pip install --no-cache-dir --no-index --find-links "$2" headroom
    ;;
  *)
    echo "usage: install.sh build SRC WHEELS | runtime WHEELS" >&2
    exit 2
    ;;
esac
