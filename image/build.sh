#!/usr/bin/env bash
# Builds the operator and emulator images from ./Dockerfile without a Docker daemon, runs them,
# and writes what it saw to image/BUILD-RESULT.md (committed; tests/operator/test_image.py
# checks that it describes the Dockerfile and constraints as they are now).
#
# Run by `make image` (as root: debootstrap and buildah's vfs storage need it). Steps:
#   1. the base: Debian bookworm minbase with python3 and python3-venv, made by debootstrap
#      (no registry is reachable here, so Python's official image cannot be pulled), imported
#      into buildah's storage as localhost/specpilot-base:bookworm;
#   2. `buildah bud` of the Dockerfile's two targets over that base (vfs storage driver, chroot
#      isolation: no daemon, no overlay mounts, no user namespaces);
#   3. each image is run with `buildah run` (as the image's user, 65532): `specpilot --version`
#      and `specpilot operator --help`; the emulator image `specpilot emulate --help`;
#   4. the OCI-layout path, which needs no container runtime at all: `skopeo copy` to an OCI
#      layout, `umoci unpack` of it, and the same commands in its root filesystem with
#      `chroot --userspec=65532:65532`;
#   5. sizes: buildah's (uncompressed) and the compressed OCI layout's blobs (du).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${SPECPILOT_IMAGE_WORK:-/var/tmp/specpilot-image}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")
BASE=localhost/specpilot-base:bookworm
OPERATOR=localhost/specpilot:$VERSION
EMULATOR=localhost/specpilot-emulator:$VERSION
RESULT=$ROOT/image/BUILD-RESULT.md
BUILDAH=(buildah --storage-driver vfs)
LOG=$WORK/build.log
HOST_CA=${SPECPILOT_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}

for tool in buildah debootstrap skopeo umoci; do
    command -v "$tool" >/dev/null || {
        echo "error: $tool is missing: apt-get install buildah debootstrap skopeo umoci" >&2
        exit 2
    }
done
mkdir -p "$WORK"
: >"$LOG"

step() { echo "== $*" | tee -a "$LOG" >&2; }
# Runs a command, keeping its output in the log and in $OUT_TEXT.
capture() {
    OUT_TEXT=$("$@" 2>&1) || { echo "$OUT_TEXT" >>"$LOG"; echo "error: $* failed" >&2; exit 1; }
    echo "$OUT_TEXT" >>"$LOG"
}

step "1. base image from Debian's packages"
if ! "${BUILDAH[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
    if [ ! -x "$WORK/rootfs/usr/bin/python3" ]; then  # a finished debootstrap is kept
        rm -rf "$WORK/rootfs"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$WORK/rootfs" http://deb.debian.org/debian >>"$LOG" 2>&1
    fi
    # apt's package lists and caches are of no use in an image that never runs apt
    rm -rf "$WORK/rootfs/var/lib/apt/lists/"* "$WORK/rootfs/var/cache/apt/"*
    container=$("${BUILDAH[@]}" from scratch)
    mount=$("${BUILDAH[@]}" mount "$container")
    cp -a "$WORK/rootfs/." "$mount/"
    "${BUILDAH[@]}" umount "$container" >/dev/null
    "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd /bin/bash "$container"
    "${BUILDAH[@]}" commit -q "$container" "$BASE" >/dev/null
    "${BUILDAH[@]}" rm "$container" >/dev/null
fi

step "2. buildah bud (vfs, chroot isolation)"
durations=()
for target in operator emulator; do
    tag=$OPERATOR
    [ "$target" = emulator ] && tag=$EMULATOR
    started=$(date +%s)
    # This machine reaches PyPI through a TLS-inspecting proxy: its CA bundle is mounted for
    # the build's RUN steps only (never copied into a layer) and named to pip.
    "${BUILDAH[@]}" bud --isolation chroot --layers=false --pull=never \
        --volume "$HOST_CA:/run/specpilot-build/ca.crt:ro" \
        --build-arg PIP_CERT=/run/specpilot-build/ca.crt \
        --build-arg PYTHON_IMAGE="$BASE" --target "$target" -t "$tag" "$ROOT" >>"$LOG" 2>&1
    durations+=("$target: $(($(date +%s) - started)) s")
    echo "$target built in $(($(date +%s) - started)) s" | tee -a "$LOG" >&2
done

step "3. buildah run, as the image's user"
run_in() {  # image, command...
    local image=$1 container status=0
    shift
    container=$("${BUILDAH[@]}" from --pull=never "$image")
    OUT_TEXT=$("${BUILDAH[@]}" run --isolation chroot "$container" -- "$@" 2>&1) || status=$?
    echo "$OUT_TEXT" >>"$LOG"
    "${BUILDAH[@]}" rm "$container" >/dev/null  # a failed command leaves no container behind
    [ "$status" = 0 ] || { echo "error: $* failed in $image (exit $status)" >&2; exit 1; }
}
run_in "$OPERATOR" id -u && uid=$OUT_TEXT
run_in "$OPERATOR" specpilot --version && version_out=$OUT_TEXT
run_in "$OPERATOR" specpilot operator --help && help_out=$OUT_TEXT
run_in "$EMULATOR" specpilot emulate --help && emulate_out=$OUT_TEXT
# no torch and no engine: the operator's dependencies only
run_in "$OPERATOR" python -c \
    "import importlib.util as u; print(sorted(m for m in ('torch', 'vllm', 'sglang') if u.find_spec(m)))"
missing=$OUT_TEXT
[ "$uid" = 65532 ] || { echo "error: the image runs as uid $uid, not 65532" >&2; exit 1; }
[ "$missing" = "[]" ] || { echo "error: the image holds $missing" >&2; exit 1; }

step "4. OCI layout, unpacked and run with chroot (no container runtime)"
rm -rf "$WORK/oci" "$WORK/bundle"
"${BUILDAH[@]}" push -q "$OPERATOR" "oci:$WORK/oci:operator" >>"$LOG" 2>&1
umoci unpack --image "$WORK/oci:operator" "$WORK/bundle" >>"$LOG" 2>&1
capture chroot --userspec=65532:65532 "$WORK/bundle/rootfs" /usr/bin/env -i \
    PATH=/opt/specpilot/bin:/usr/bin:/bin HOME=/tmp specpilot --version
chroot_version=$OUT_TEXT
capture chroot --userspec=65532:65532 "$WORK/bundle/rootfs" /usr/bin/env -i \
    PATH=/opt/specpilot/bin:/usr/bin:/bin HOME=/tmp specpilot operator --help
chroot_help_lines=$(echo "$OUT_TEXT" | wc -l)

step "4b. the same root filesystem read-only, /tmp a tmpfs (the chart's readOnlyRootFilesystem)"
readonly_root=$WORK/readonly-root
mkdir -p "$readonly_root"
mount --bind "$WORK/bundle/rootfs" "$readonly_root"
mount -o remount,bind,ro "$readonly_root"
mount -t tmpfs tmpfs "$readonly_root/tmp"
in_readonly() {
    chroot --userspec=65532:65532 "$readonly_root" /usr/bin/env -i PATH=/opt/specpilot/bin:/usr/bin:/bin \
        HOME=/tmp MPLCONFIGDIR=/tmp/matplotlib PYTHONDONTWRITEBYTECODE=1 "$@"
}
status=0
in_readonly sh -c 'touch /opt/specpilot/probe' >>"$LOG" 2>&1 || status=$?
# the operator's whole import graph (kopf, the kubernetes client, the handlers) on it
imports=$(in_readonly python -c "import specpilot.operator.kube.handlers; print('imported')" 2>&1) ||
    imports="failed: $imports"
# no cluster: one error line and exit 2, not kopf retrying a login forever
unreachable_status=0
unreachable=$(in_readonly specpilot operator --standalone --liveness-port 0 --metrics-port 0 \
    --kubeconfig /nonexistent 2>&1) || unreachable_status=$?
umount "$readonly_root/tmp"
umount "$readonly_root"
[ "$status" != 0 ] || { echo "error: the read-only root filesystem was writable" >&2; exit 1; }
echo "$imports" "$unreachable" >>"$LOG"

step "5. sizes"
sizes=$("${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -E "specpilot(-emulator|-base)?:")
layout_bytes=$(du -sb "$WORK/oci/blobs" | cut -f1)

dockerfile_sha=$(sha256sum "$ROOT/Dockerfile" | cut -d' ' -f1)
constraints_sha=$(sha256sum "$ROOT/image/constraints.txt" | cut -d' ' -f1)
{
    echo "# Image build record"
    echo
    echo "Written by \`make image\` (image/build.sh) on $(date -u +%Y-%m-%dT%H:%M:%SZ); buildah"
    echo "$(buildah --version | cut -d' ' -f3), vfs storage, chroot isolation, over a Debian bookworm"
    echo "base made by debootstrap (no registry is reachable here)."
    echo
    echo "- Dockerfile sha256: \`$dockerfile_sha\`"
    echo "- image/constraints.txt sha256: \`$constraints_sha\`"
    echo
    echo "## Sizes"
    echo
    echo "\`buildah images\` (uncompressed):"
    echo
    echo '```'
    echo "$sizes"
    echo '```'
    echo
    echo "The operator image as an OCI layout (compressed layers; \`du -sb oci/blobs\`): $layout_bytes bytes."
    echo
    echo "Build time per target (\`date +%s\` around each \`buildah bud\`, on $(nproc) cores shared with"
    echo "whatever else ran; each target runs the build stage again): $(IFS=';'; echo "${durations[*]}")."
    echo
    echo "## Runs"
    echo
    echo "\`buildah run\` as the image's user (\`id -u\`: $uid); torch, vllm, sglang importable: $missing."
    echo
    echo '```'
    echo "$ specpilot --version"
    echo "$version_out"
    echo "$ specpilot operator --help"
    echo "$help_out"
    echo '```'
    echo
    echo "The emulator image: \`specpilot emulate --help\` printed $(echo "$emulate_out" | wc -l) lines"
    echo "starting with \`$(echo "$emulate_out" | head -1)\`."
    echo
    echo "The OCI-layout path (\`umoci unpack\`, then \`chroot --userspec=65532:65532\`):"
    echo "\`specpilot --version\` printed \`$chroot_version\`; \`specpilot operator --help\`"
    echo "printed $chroot_help_lines lines."
    echo
    echo "The same root filesystem bind-mounted read-only with a tmpfs on /tmp (the chart's"
    echo "readOnlyRootFilesystem and its /tmp emptyDir): writing under /opt failed (exit $status);"
    echo "importing the operator's handlers printed \`$imports\`; \`specpilot operator --kubeconfig"
    echo "/nonexistent\` exited $unreachable_status, printing \`$unreachable\`."
} >"$RESULT"
echo "wrote $RESULT" >&2
