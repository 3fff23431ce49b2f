#!/usr/bin/env bash
# Builds the CPU image with podman from the host's binary and default model (no registry, no
# compiler in the image: deploy/docker/build-stage.sh takes deploy/docker/prebuilt/), then runs
# it as SageMaker would and checks /ping, /invocations and that SIGTERM (podman stop) lets an
# in-flight request finish.
#   LMI_BIN   the binary to put in the image (default: target/debug/lmi as `cargo test --workspace`
#             builds it, optimized: deploy/ci/lmi-bin.sh, a no-op after the tests)
#   LMI_GGUF  the default model's GGUF (default: the test cache's)
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
cleanup() { podman rm -f "$name" >/dev/null 2>&1 || true; }
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
echo "image: ok"
