#!/usr/bin/env bash
# Renders every overlay with kubectl kustomize and validates it offline against the Kubernetes
# schemas (kubernetes-validate --strict). Kinds without a bundled schema (the CRDs: InferencePool,
# HTTPRoute, ServiceMonitor) are listed as warnings. Writes the renders to $1.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
for overlay in deploy/k8s/cpu deploy/k8s/gpu; do
    name=$(basename "$overlay")
    kubectl kustomize "$overlay" >"$out/$name.yaml"
    echo "== $overlay: $(grep -c '^kind:' "$out/$name.yaml") resources"
    kubernetes-validate --strict --quiet "$out/$name.yaml"
done
