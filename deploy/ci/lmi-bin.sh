#!/usr/bin/env bash
# Prints the path of the `lmi` binary the deployment checks package (image.sh, clean-room.sh):
# $LMI_BIN when set; otherwise the one `cargo test --workspace` builds (the workspace's
# [profile.test]: opt-level 3), made current here first.
#
# `cargo build` (dev profile, unoptimized: ~3 tokens/s on the default model, too slow for
# image.sh's 200-token drain check across `podman stop -t 60`) writes the same
# target/debug/lmi, so that path alone holds whichever ran last. `cargo test --workspace
# --no-run` is the tests' own build: right after them (as in .ci/run) it compiles nothing and
# relinks target/debug/lmi to their binary in under a second. (`cargo build --profile test
# --bin lmi` is not the same build: without dev-dependencies getrandom's features differ and
# it recompiled the workspace at opt-level 3, 7 minutes on 2 cores.)
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
