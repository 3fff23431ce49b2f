#!/usr/bin/env bash
# Builds the fake CUDA driver (crates/cuda-emu/fake/: a libcuda.so.1 and a libcublas.so.13
# that run the real host code's calls on the CPU, kernels through the emulator) and prints its
# folder, for LMI_CUDA_LIB_DIR:
#   LMI_CUDA_LIB_DIR=$(tests/gpu/fake-driver.sh) target/debug/lmi serve --device cuda
# Extra arguments go to cargo (--release for an optimized emulator).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(cargo build -q -p lmi-cuda-emu --message-format=json "$@" | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and "#lmi-cuda-emu@" in m["package_id"]:
        print(m["out_dir"] + "/fake")
')
[ -f "$dir/libcuda.so.1" ] && [ -f "$dir/libcublas.so.13" ] ||
    { echo "fake-driver.sh: no fake driver was built in ${dir:-?}" >&2; exit 1; }
echo "$dir"
