#!/usr/bin/env bash
# Builds what the GPU checks run (tests/gpu/README.md) into .gpu/ (git-ignored): the lmi
# binary and the CUDA test binaries, stripped, plus run-tests.sh. With --model, also the
# default model's GGUF split into parts small enough to carry.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu
cargo build --release -p lmi-server
cp target/release/lmi .gpu/lmi
strip .gpu/lmi
# The CUDA test binaries of lmi-engine (test profile), found through cargo's JSON messages.
cargo test -p lmi-engine --no-run --message-format=json \
    --test cuda_ops --test cuda_attention --test cuda_sampling --test cuda_engine 2>/dev/null |
    python3 -c '
import json, shutil, subprocess, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        dst = ".gpu/" + m["target"]["name"]
        shutil.copy(m["executable"], dst)
        subprocess.run(["strip", dst], check=True)
        print(dst)
'
cat > .gpu/run-tests.sh <<'RUN'
#!/usr/bin/env bash
# Runs every CUDA test binary on this machine's GPU (they use it when a driver is present).
cd "$(dirname "$0")/.."
status=0
for t in .gpu/cuda_*; do
    echo "== $t"
    "$t" --test-threads=1 --nocapture || status=1
done
exit $status
RUN
chmod +x .gpu/run-tests.sh
if [ "${1:-}" = "--model" ]; then
    gguf=$(ls "${LMI_MODEL_CACHE:-$HOME/.cache/lmi/models}"/SmolLM2-135M-Instruct*.gguf | head -1)
    split -b 48M -d "$gguf" .gpu/model.
    echo "split $gguf into .gpu/model.*: carry one part per call, then cat them in order"
fi
du -sh .gpu
