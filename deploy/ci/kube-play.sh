#!/usr/bin/env bash
# Runs the rendered cpu Deployment (one replica) with podman kube play and checks that it
# answers. $1: the cpu overlay's render (k8s.sh); the image must be built (image.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
render=$1
port=${LMI_CI_KUBE_PORT:-18482}
play=$(mktemp --suffix=.yaml)
# Only the Deployment: podman runs pods, not Services or CRDs. The container port is published
# on the host (kube play's hostPort), which a cluster would reach through the Service instead.
python3 - "$render" "$port" >"$play" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "lmi")
dep["spec"]["replicas"] = 1
c = dep["spec"]["template"]["spec"]["containers"][0]
c["ports"][0]["hostPort"] = int(sys.argv[2])
c["ports"][0]["hostIP"] = "127.0.0.1"
# The CI machine has 2 cores: ask for what is there.
c.pop("resources", None)
yaml.safe_dump(dep, sys.stdout)
PY
cleanup() { podman kube down "$play" >/dev/null 2>&1 || true; rm -f "$play"; }
trap cleanup EXIT
podman kube play "$play"
url=http://127.0.0.1:$port
for _ in $(seq 1 120); do
    curl -fsS "$url/ping" >/dev/null 2>&1 && break
    sleep 1
done
curl -fsS "$url/ping"; echo
out=$(curl -fsS "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}')
echo "/v1/chat/completions: $out"
echo "$out" | grep -q '"chat.completion"' || { echo "no chat completion"; exit 1; }
curl -fsS "$url/metrics" | grep -E '^vllm:(num_requests_waiting|kv_cache_usage_perc) ' 
echo "kube play: ok"
