#!/usr/bin/env bash
# Builds the CPU image with podman from the host's binary and default model (no registry, no
# compiler in the image: deploy/docker/build-stage.sh takes deploy/docker/prebuilt/), then runs
# it as SageMaker would and checks /ping, /invocations and that SIGTERM (podman stop) lets an
# in-flight request finish; then runs it again with HF_MODEL_ID naming the default model's GGUF
# on the stand-in Hub (crates/store/examples/fake_hub.rs) and checks it answers the same.
#   LMI_BIN   the binary to put in the image (default: target/debug/lmi as `cargo test --workspace`
#             builds it, optimized: deploy/ci/lmi-bin.sh, a no-op after the tests)
#   LMI_GGUF  the default model's GGUF (default: the test cache's)
#   LMI_FAKE_HUB  the stand-in Hub (default: target/debug/examples/fake_hub, as the tests build it)
set -euo pipefail
cd "$(dirname "$0")/../.."
image=${LMI_IMAGE:-localhost/lmi:cpu}
port=${LMI_CI_PORT:-18481}
bin=$(deploy/ci/lmi-bin.sh)
gguf=${LMI_GGUF:-${LMI_MODEL_CACHE:-$HOME/.cache/lmi/models}/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -x "$bin" ] || { echo "no binary at $bin (LMI_BIN): build it first, e.g. cargo build --release -p lmi-server and LMI_BIN=target/release/lmi"; exit 1; }
[ -f "$gguf" ] || { echo "no default model GGUF at $gguf: run \`lmi serve\` or the tests once"; exit 1; }

prebuilt=deploy/docker/prebuilt
rm -rf "$prebuilt" && mkdir -p "$prebuilt"
# Stripped here: the base has no binutils, and debug info would triple the context.
strip -o "$prebuilt/lmi" "$bin"
cp "$gguf" "$prebuilt/"
deploy/ci/base-image.sh docker.io/library/debian:bookworm-slim
podman build --pull=never -f deploy/docker/cpu.Dockerfile \
    --build-arg BUILD_IMAGE=docker.io/library/debian:bookworm-slim -t "$image" .
rm -rf "$prebuilt"
podman image ls "$image"

name=lmi-ci-$$
hub_pid=
cleanup() {
    podman rm -f "$name" "$name-hub" >/dev/null 2>&1 || true
    [ -z "$hub_pid" ] || kill "$hub_pid" 2>/dev/null || true
}
trap cleanup EXIT
# SAGEMAKER_BIND_TO_PORT moves the port; the argument is SageMaker's `serve`.
podman run -d --name "$name" -p "127.0.0.1:$port:8123" -e SAGEMAKER_BIND_TO_PORT=8123 \
    -e OPTION_MAX_ROLLING_BATCH_SIZE=4 "$image" serve
url=http://127.0.0.1:$port
for _ in $(seq 1 120); do
    curl -fsS "$url/ping" >/dev/null 2>&1 && break
    sleep 1
done
curl -fsS "$url/ping"; echo
out=$(curl -fsS "$url/invocations" -H 'Content-Type: application/json' \
    -d '{"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8, "do_sample": false}}')
echo "/invocations: $out"
echo "$out" | grep -q '"generated_text"' || { echo "no generated_text"; exit 1; }

# An in-flight streaming request must finish after podman stop (SIGTERM): the server drains.
stream=$(mktemp)
curl -sS -N "$url/invocations" -H 'Content-Type: application/json' \
    -d '{"inputs": "Count from one to one hundred:", "parameters": {"max_new_tokens": 200, "ignore_eos": true}, "stream": true}' \
    >"$stream" &
curl_pid=$!
for _ in $(seq 1 100); do [ -s "$stream" ] && break; sleep 0.1; done
podman stop -t 60 "$name" >/dev/null
wait "$curl_pid"
lines=$(grep -c '"token"' "$stream" || true)
echo "tokens streamed across podman stop: $lines"
podman logs "$name" 2>&1 | tail -n 3
code=$(podman inspect -f '{{.State.ExitCode}}' "$name")
rm -f "$stream"
[ "$lines" -eq 200 ] || { echo "the in-flight request did not finish ($lines of 200 tokens)"; exit 1; }
[ "$code" -eq 0 ] || { echo "exit code $code after SIGTERM"; exit 1; }

# The model by name, as SageMaker passes it (HF_MODEL_ID), from a Hub on the host.
hub_bin=${LMI_FAKE_HUB:-target/debug/examples/fake_hub}
[ -x "$hub_bin" ] || cargo test -q -p lmi-store --no-run
hub_out=$(mktemp)
"$hub_bin" --repo "test/SmolLM2-GGUF=$gguf" >"$hub_out" &
hub_pid=$!
for _ in $(seq 1 100); do [ -s "$hub_out" ] && break; sleep 0.1; done
hub_url=$(head -n 1 "$hub_out")
rm -f "$hub_out"
hub_port=$((port + 1))
podman run -d --name "$name-hub" --network host -e SAGEMAKER_BIND_TO_PORT="$hub_port" \
    -e HF_MODEL_ID=test/SmolLM2-GGUF:Q4_1 -e HF_ENDPOINT="$hub_url" "$image" serve
hub_serve=http://127.0.0.1:$hub_port
for _ in $(seq 1 120); do
    curl -fsS "$hub_serve/ping" >/dev/null 2>&1 && break
    sleep 1
done
by_name=$(curl -fsS "$hub_serve/invocations" -H 'Content-Type: application/json' \
    -d '{"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8, "do_sample": false}}')
echo "/invocations, HF_MODEL_ID from the Hub: $by_name"
# The log is read whole first: `podman logs | grep -m 1` under pipefail fails when grep exits
# before podman has written everything (SIGPIPE), though the line is there.
hub_log=$(podman logs "$name-hub" 2>&1)
grep -m 1 "hub, commit" <<<"$hub_log" || { echo "no Hub fetch in the log"; exit 1; }
[ "$by_name" = "$out" ] || { echo "the model fetched by name answers differently"; exit 1; }
echo "image: ok"
