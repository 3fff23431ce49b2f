#!/usr/bin/env bash
# Prints the path of the `lmi` binary the deployment checks package (image.sh, clean-room.sh):
# $LMI_BIN when it is set, used as it is; otherwise the `lmi` that `cargo test --workspace`
# builds, made current here first.
#
# Both `cargo build` (dev profile: unoptimized, about 3 tokens a second on the default model,
# too slow for image.sh's drain check of 200 tokens across `podman stop -t 60`) and
# `cargo test` (test profile: the workspace's [profile.test] has opt-level 3) write
# target/debug/lmi, so that path alone holds whichever ran last. `cargo test --workspace
# --no-run` is the same build as the tests' (same profile, same features): right after them,
# as in .ci/run, it compiles nothing and only links target/debug/lmi to the test profile's
# binary again (under a second on 2 cores, after `cargo build` had replaced it). `cargo build
# --profile test -p lmi-server --bin lmi` is not the same build: without the dev-dependencies
# getrandom loses features (std and sys_rng, from proptest's rand), and it recompiled
# getrandom, tempfile, zip, safetensors, the engine, scheduler, bench and server at opt-level
# 3 (7 minutes on 2 busy cores). Where the tests were not built, this compiles what
# `cargo test --workspace` would.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${LMI_BIN:-}" ]; then
    echo "$LMI_BIN"
    exit 0
fi
# cargo writes its progress to stderr; stdout is the path alone.
cargo test --workspace --no-run >&2
target=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
echo "$target/debug/lmi"
