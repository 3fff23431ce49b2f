#!/usr/bin/env bash
# The deployment checks of CI (called by .ci/run after the tests, which build the optimized
# target/debug/lmi that image.sh packages through deploy/ci/lmi-bin.sh, and fetch the default
# model): hadolint every Dockerfile, render and validate the Kubernetes overlays, build and run
# the CPU image with podman, run the cpu Deployment with podman kube play. Installs and checks
# its tools first (deploy/ci/tools.sh). Prints each step's time.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF=$PWD/deploy/ci/containers.conf
t0=$SECONDS
step() { echo "== deploy: $1 ($((SECONDS - t0)) s)"; }

step "tools"
deploy/ci/tools.sh

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
