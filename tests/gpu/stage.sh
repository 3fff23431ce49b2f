#!/usr/bin/env bash
# Builds what the device runbook (tests/gpu/run.sh, tests/gpu/README.md) carries into .gpu/
# (git-ignored), in two parts that each fit one call of the device tool (64 MiB with the
# working tree):
#   .gpu/a/  bin.tar.xz (the lmi binary and the CUDA test binaries, stripped) and the default
#            model's first bytes          -> carried by the first call (`run.sh unpack`)
#   .gpu/b/  the rest of the model        -> carried by the second (`run.sh tests`)
# and .gpu/bin/ (the same binaries, unpacked: what `run.sh --fake` rehearses with here).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu
mkdir -p .gpu/a .gpu/b .gpu/bin
cargo build --release -p lmi-server
cp target/release/lmi .gpu/bin/lmi
# The CUDA test binaries (test profile, optimized), found through cargo's JSON messages.
cargo test -p lmi-engine -p lmi-cuda --no-run --message-format=json \
    --test cuda_ops --test cuda_attention --test cuda_sampling --test cuda_engine --test cuda_qwen_vl \
    --test cuda_gemma3 --test cuda_moe --test cuda_delta_net --test cuda_hybrid \
    --test nvrtc_compile 2>/dev/null |
    python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".gpu/bin/" + m["target"]["name"])
'
for f in .gpu/bin/*; do strip "$f"; done
tar -C .gpu/bin -cf - . | xz -T0 -6 >.gpu/a/bin.tar.xz

# The model, split where the first call's 64 MiB run out (the working tree travels too).
gguf=$(ls "${LMI_MODEL_CACHE:-$HOME/.cache/lmi/models}"/SmolLM2-135M-Instruct*.gguf | head -1)
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
room=$(( (64 << 20) - tree - $(stat -c %s .gpu/a/bin.tar.xz) - (2 << 20) ))
head -c "$room" "$gguf" >.gpu/a/model.00
tail -c +"$((room + 1))" "$gguf" >.gpu/b/model.01
sha256sum <"$gguf" | cut -d' ' -f1 >.gpu/a/model.sha256
(( $(stat -c %s .gpu/b/model.01) + tree < (62 << 20) )) ||
    { echo "stage.sh: the model's second part does not fit one call" >&2; exit 1; }
du -sh .gpu/a .gpu/b
echo "carry .gpu/a with 'tests/gpu/run.sh unpack', then .gpu/b with 'tests/gpu/run.sh tests'"
