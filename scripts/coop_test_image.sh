#!/usr/bin/env bash
# Builds the local base image the Docker tests of the coop scorer build their task image FROM
# (tests/data/cooperbench/wordkit_task/task1/Dockerfile): Debian bookworm with Python 3 (as python and
# python3) and git, made with mmdebstrap from the Debian mirror and loaded with docker import, since
# no container registry need be reachable. Needs root, mmdebstrap and a Docker daemon. Does nothing
# when the image is there already. Used by .ci/run; run it by hand to run those tests elsewhere.
set -euo pipefail
image=scope-coop-test-base:bookworm
if docker image inspect "$image" >/dev/null 2>&1; then
    echo "$image is there already"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mmdebstrap --variant=minbase --include=python3,python-is-python3,git --quiet bookworm "$tmp/rootfs.tar"
docker import "$tmp/rootfs.tar" "$image" >/dev/null
echo "built $image"
