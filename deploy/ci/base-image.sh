#!/usr/bin/env bash
# A local Debian base for the image builds, since no registry is reachable: mmdebstrap minbase
# (with CA certificates and useradd), imported into podman under the name the Dockerfiles'
# FROM lines use. Reused when already present.
set -euo pipefail
name=${1:-docker.io/library/debian:bookworm-slim}
if podman image exists "$name"; then
    echo "base image $name: present"
    exit 0
fi
tar=$(mktemp --suffix=.tar)
trap 'rm -f "$tar"' EXIT
# The mirror is given so that mmdebstrap does not read a sources.list from stdin.
mmdebstrap --variant=minbase --include=ca-certificates,passwd \
    --aptopt='Acquire::Retries "3"' \
    bookworm "$tar" http://deb.debian.org/debian </dev/null
podman import --change 'CMD ["/bin/bash"]' "$tar" "$name"
