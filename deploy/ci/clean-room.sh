#!/usr/bin/env bash
# Runs the deployment checks on a clean Debian 12 instead of a machine that has been used
# before: a new bookworm chroot from mmdebstrap (minbase, plus python3 with a venv for pip,
# as the CI machine has Python and pip; no podman, catatonit, curl, binutils or kubectl), this
# checkout cloned into it, deploy/ci/check.sh run inside as root. Not part of .ci/run; run it
# (as root, on a host with mmdebstrap) whenever deploy/ci/tools.sh or a step's programs change.
#   LMI_BIN   the binary for the image (default: target/debug/lmi as `cargo test --workspace`
#             builds it, optimized: deploy/ci/lmi-bin.sh, run on the host; the chroot has no Rust)
#   LMI_GGUF  the default model's GGUF (default: the test cache's)
#   KEEP=1    leave the chroot in place (its path is printed)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "$(deploy/ci/lmi-bin.sh)")
gguf=$(realpath "${LMI_GGUF:-${LMI_MODEL_CACHE:-$HOME/.cache/lmi/models}/SmolLM2-135M-Instruct.Q4_1.gguf}")
[ -x "$bin" ] || { echo "no binary at $bin (LMI_BIN): build it first, e.g. cargo build --release -p lmi-server and LMI_BIN=target/release/lmi"; exit 1; }
[ -f "$gguf" ] || { echo "no default model GGUF at $gguf: run \`lmi serve\` or the tests once"; exit 1; }
command -v mmdebstrap >/dev/null || { echo "clean-room.sh needs mmdebstrap on the host"; exit 1; }

root=$(mktemp -d /var/tmp/lmi-clean-room.XXXXXX)
mounts=()
cleanup() {
    # Containers first (they hold mounts under the chroot), then the mounts, newest first.
    chroot "$root" sh -c 'podman rm -af; podman pod rm -af' >/dev/null 2>&1 || true
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -R "${mounts[i]}" 2>/dev/null || true; done
    if [ "${KEEP:-0}" = 1 ]; then echo "chroot kept at $root"; else rm -rf --one-file-system "$root"; fi
}
trap cleanup EXIT
mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates,git \
    --aptopt='Acquire::Retries "3"' bookworm "$root" http://deb.debian.org/debian </dev/null
# The host's way out to the registries (DNS, a proxy's CA bundle, pip's config): what this
# machine's network needs, not part of what is checked.
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
pass_env=()
for v in PIP_CERT SSL_CERT_FILE REQUESTS_CA_BUNDLE CURL_CA_BUNDLE; do
    [ -n "${!v:-}" ] && pass_env+=("$v=${!v}")
done
mnt() { mkdir -p "$root$2"; mount "${@:3}" "$1" "$root$2"; mounts+=("$root$2"); }
# The root a mount point of its own, as in a container: podman remounts / when it unpacks.
mnt "$root" / --bind
mnt proc /proc -t proc
mnt /sys /sys --rbind
mnt /dev /dev --rbind
mnt tmpfs /run -t tmpfs
mnt tmpfs /tmp -t tmpfs

# The checkout as committed (a clone, as CI sees it), the binary and the model beside it.
git clone -q "$PWD" "$root/src"
mkdir -p "$root/src/target/debug" "$root/models"
cp "$bin" "$root/src/target/debug/lmi"
cp "$gguf" "$root/models/"
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/opt/py/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LMI_BIN=/src/target/debug/lmi LMI_GGUF="/models/$(basename "$gguf")" "${pass_env[@]}" /bin/bash -euo pipefail -c '
        python3 -m venv /opt/py
        cd /src
        deploy/ci/check.sh'
echo "clean room: the deployment checks passed on a new Debian 12"
