#!/usr/bin/env bash
# Builds the images from ./Dockerfile without a Docker daemon, runs them, and writes what it saw
# under $WORK/out/ (one file per fact; tests/operator/test_image_build.py reads them).
#
#   image/build.sh           `make image`: both targets (operator, emulator); also rewrites
#                            image/BUILD-RESULT.md (committed; tests/operator/test_image.py
#                            checks that it describes the Dockerfile and constraints as they are)
#   image/build.sh --check   `make test` (through tests/operator/test_image_build.py): the
#                            operator target only, nothing committed is written
#
# As root (debootstrap, buildah's storage and the mounts need it). Steps:
#   1. the base: Debian bookworm minbase with python3 and python3-venv, made by debootstrap
#      (no registry is reachable here, so Python's official image cannot be pulled) and kept in
#      $CACHE under a key made of debootstrap's arguments; imported into buildah's storage
#      (under $WORK, not the machine's /var/lib/containers) as localhost/specpilot-base:<key>;
#   2. `buildah bud` of the Dockerfile's targets over that base (overlay storage where the
#      kernel mounts it, else vfs; chroot isolation: no daemon, no user namespaces);
#   3. each image is run with `buildah run` (as the image's user, 65532): `specpilot --version`
#      and `specpilot operator --help`; the emulator image `specpilot emulate --help`;
#   4. the OCI-layout path, which needs no container runtime at all: `buildah push` to an OCI
#      layout, `umoci unpack` of it, and the same commands in its root filesystem with
#      `chroot --userspec=65532:65532`; then that root filesystem bind-mounted read-only with
#      a tmpfs on /tmp (the chart's readOnlyRootFilesystem): the commands again, a write under
#      /opt, the operator's handlers imported, `specpilot operator` with no cluster;
#   5. sizes: buildah's (uncompressed) and the compressed OCI layout's blobs (du).
set -euo pipefail

MODE=full
case "${1:-}" in
--check) MODE=check ;;
"") ;;
*) echo "usage: image/build.sh [--check]" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${SPECPILOT_IMAGE_WORK:-/var/tmp/specpilot-image}
CACHE=${SPECPILOT_IMAGE_CACHE:-$WORK/cache}
OUT=$WORK/out
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")
RESULT=$ROOT/image/BUILD-RESULT.md
LOG=$WORK/build.log
HOST_CA=${SPECPILOT_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
DEBOOTSTRAP_ARGS=(--variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE")
BASE_KEY=$(printf '%s\n' "${DEBOOTSTRAP_ARGS[@]}" "$MIRROR" | sha256sum | cut -c1-12)
BASE=localhost/specpilot-base:$BASE_KEY
OPERATOR=localhost/specpilot:$VERSION
EMULATOR=localhost/specpilot-emulator:$VERSION
# overlay where this kernel mounts it on $WORK's filesystem (a `buildah from` then costs no copy),
# else vfs (copies every layer; works everywhere); SPECPILOT_IMAGE_STORAGE=vfs|overlay forces one.
STORAGE=${SPECPILOT_IMAGE_STORAGE:-auto}
TARGETS=(operator emulator)
[ "$MODE" = check ] && TARGETS=(operator)

for tool in buildah debootstrap umoci; do
    command -v "$tool" >/dev/null || {
        echo "error: $tool is missing: apt-get install buildah debootstrap umoci" >&2
        exit 2
    }
done
[ "$(id -u)" = 0 ] || { echo "error: image/build.sh needs root (debootstrap, mounts)" >&2; exit 2; }
mkdir -p "$WORK" "$CACHE"
rm -rf "$OUT"
mkdir -p "$OUT"
: >"$LOG"
if [ "$STORAGE" = auto ]; then
    probe=$WORK/overlay-probe
    rm -rf "$probe" && mkdir -p "$probe"/{lower,upper,work,merged}
    STORAGE=vfs
    if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
        "$probe/merged" 2>>"$LOG"; then
        umount "$probe/merged"
        STORAGE=overlay
    fi
    rm -rf "$probe"
fi
# each driver its own storage, so a switch never reads the other's layers
BUILDAH=(buildah --storage-driver "$STORAGE" --root "$WORK/storage-$STORAGE" --runroot "$WORK/run-$STORAGE")

step() { echo "== $*" | tee -a "$LOG" >&2; }
# Runs a command, keeping its output in the log and in $OUT_TEXT.
capture() {
    OUT_TEXT=$("$@" 2>&1) || { echo "$OUT_TEXT" >>"$LOG"; echo "error: $* failed" >&2; exit 1; }
    echo "$OUT_TEXT" >>"$LOG"
}
record() { printf '%s\n' "$2" >"$OUT/$1"; }  # name, text
started_at=$(date +%s)
phase_started=$started_at
timing() {  # name: seconds since the last timing
    local now
    now=$(date +%s)
    echo "$1 $((now - phase_started))" >>"$OUT/timings"
    phase_started=$now
}

readonly_root=$WORK/readonly-root
declare -A containers=()
# A failure between the mounts and their umount must not leave them behind (a later rm -rf of
# $WORK would walk into them).
cleanup() {
    [ "${#containers[@]}" = 0 ] || remove_containers
    mountpoint -q "$readonly_root/tmp" 2>/dev/null && umount "$readonly_root/tmp"
    mountpoint -q "$readonly_root" 2>/dev/null && umount "$readonly_root"
    return 0
}
trap cleanup EXIT

printf '%s\n' "$STORAGE" >"$OUT/storage-driver"
step "1. base image from Debian's packages (key $BASE_KEY), $STORAGE storage"
rootfs=$CACHE/base-$BASE_KEY
if ! "${BUILDAH[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
    if [ ! -e "$rootfs/.complete" ]; then  # a finished debootstrap is kept, keyed by its inputs
        rm -rf "$rootfs"
        debootstrap "${DEBOOTSTRAP_ARGS[@]}" "$rootfs" "$MIRROR" >>"$LOG" 2>&1
        # apt's package lists and caches are of no use in an image that never runs apt
        rm -rf "$rootfs/var/lib/apt/lists/"* "$rootfs/var/cache/apt/"*
        touch "$rootfs/.complete"
        echo "debootstrap: made $rootfs" >>"$LOG"
    fi
    container=$("${BUILDAH[@]}" from scratch)
    mount=$("${BUILDAH[@]}" mount "$container")
    cp -a "$rootfs/." "$mount/"
    rm -f "$mount/.complete"
    "${BUILDAH[@]}" umount "$container" >/dev/null
    "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd /bin/bash "$container"
    "${BUILDAH[@]}" commit -q "$container" "$BASE" >/dev/null
    "${BUILDAH[@]}" rm "$container" >/dev/null
fi
timing base

step "2. buildah bud ($STORAGE storage, chroot isolation): ${TARGETS[*]}"
durations=()
for target in "${TARGETS[@]}"; do
    tag=$OPERATOR
    [ "$target" = emulator ] && tag=$EMULATOR
    built_at=$(date +%s)
    # This machine reaches PyPI through a TLS-inspecting proxy: its CA bundle is mounted for
    # the build's RUN steps only (never copied into a layer) and named to pip.
    "${BUILDAH[@]}" bud --isolation chroot --layers=false --pull=never \
        --volume "$HOST_CA:/run/specpilot-build/ca.crt:ro" \
        --build-arg PIP_CERT=/run/specpilot-build/ca.crt \
        --build-arg PYTHON_IMAGE="$BASE" --target "$target" -t "$tag" "$ROOT" >>"$LOG" 2>&1
    durations+=("$target: $(($(date +%s) - built_at)) s")
    echo "$target built in $(($(date +%s) - built_at)) s" | tee -a "$LOG" >&2
    timing "bud-$target"
done

step "3. buildah run, as the image's user"
# One working container per image for all its commands (with vfs, each `buildah from` copies
# the whole image).
run_in() {  # image, command...
    local image=$1 status=0
    shift
    [ -n "${containers[$image]:-}" ] || containers[$image]=$("${BUILDAH[@]}" from --pull=never "$image")
    local attempt
    for attempt in 1 2 3; do
        status=0
        OUT_TEXT=$("${BUILDAH[@]}" run --isolation chroot "${containers[$image]}" -- "$@" 2>&1) || status=$?
        echo "$OUT_TEXT" >>"$LOG"
        # buildah seals a memfd copy of itself before re-executing; a loaded kernel can answer
        # that with a transient EBUSY before the command ever ran (seen under stress-ng), so
        # only that message is retried: every command run here only reads the image
        [ "$status" != 0 ] && [[ "$OUT_TEXT" == *"sealing memfd copy"* ]] || break
        echo "buildah run: transient memfd EBUSY, attempt $attempt of 3" >>"$LOG"
        sleep "$attempt"
    done
    [ "$status" = 0 ] || { echo "error: $* failed in $image (exit $status)" >&2; exit 1; }
}
remove_containers() {  # a failed command leaves no container behind either
    for container in "${containers[@]}"; do "${BUILDAH[@]}" rm "$container" >/dev/null || true; done
    containers=()
}
record config-user "$("${BUILDAH[@]}" inspect --type image --format '{{.OCIv1.Config.User}}' "$OPERATOR")"
record config-entrypoint "$("${BUILDAH[@]}" inspect --type image --format '{{.OCIv1.Config.Entrypoint}}' "$OPERATOR")"
run_in "$OPERATOR" id -u && uid=$OUT_TEXT && record uid "$uid"
run_in "$OPERATOR" specpilot --version && version_out=$OUT_TEXT && record version "$version_out"
run_in "$OPERATOR" specpilot operator --help && help_out=$OUT_TEXT && record operator-help "$help_out"
if [ "$MODE" = full ]; then
    run_in "$EMULATOR" specpilot emulate --help && emulate_out=$OUT_TEXT
    record emulate-help "$emulate_out"
fi
# no torch and no engine: the operator's dependencies only
run_in "$OPERATOR" python -c \
    "import importlib.util as u; print(sorted(m for m in ('torch', 'vllm', 'sglang') if u.find_spec(m)))"
missing=$OUT_TEXT
record engines-importable "$missing"
remove_containers
[ "$uid" = 65532 ] || { echo "error: the image runs as uid $uid, not 65532" >&2; exit 1; }
[ "$missing" = "[]" ] || { echo "error: the image holds $missing" >&2; exit 1; }
timing buildah-run

step "4. OCI layout, unpacked and run with chroot (no container runtime)"
rm -rf "$WORK/oci" "$WORK/bundle"
"${BUILDAH[@]}" push -q "$OPERATOR" "oci:$WORK/oci:operator" >>"$LOG" 2>&1
umoci unpack --image "$WORK/oci:operator" "$WORK/bundle" >>"$LOG" 2>&1
if [ "$MODE" = full ]; then  # --check runs them on the read-only copy below only
    capture chroot --userspec=65532:65532 "$WORK/bundle/rootfs" /usr/bin/env -i \
        PATH=/opt/specpilot/bin:/usr/bin:/bin HOME=/tmp specpilot --version
    chroot_version=$OUT_TEXT
    capture chroot --userspec=65532:65532 "$WORK/bundle/rootfs" /usr/bin/env -i \
        PATH=/opt/specpilot/bin:/usr/bin:/bin HOME=/tmp specpilot operator --help
    chroot_help_lines=$(echo "$OUT_TEXT" | wc -l)
fi

step "4b. the same root filesystem read-only, /tmp a tmpfs (the chart's readOnlyRootFilesystem)"
mkdir -p "$readonly_root"
mount --bind "$WORK/bundle/rootfs" "$readonly_root"
mount -o remount,bind,ro "$readonly_root"
mount -t tmpfs tmpfs "$readonly_root/tmp"
in_readonly() {
    chroot --userspec=65532:65532 "$readonly_root" /usr/bin/env -i PATH=/opt/specpilot/bin:/usr/bin:/bin \
        HOME=/tmp MPLCONFIGDIR=/tmp/matplotlib PYTHONDONTWRITEBYTECODE=1 "$@"
}
status=0
write_out=$(in_readonly sh -c 'touch /opt/specpilot/probe' 2>&1) || status=$?
record readonly-write "exit $status: $write_out"
readonly_version=$(in_readonly specpilot --version 2>&1) || readonly_version="failed: $readonly_version"
record readonly-version "$readonly_version"
readonly_help=$(in_readonly specpilot operator --help 2>&1) || readonly_help="failed: $readonly_help"
record readonly-operator-help "$readonly_help"
# the operator's whole import graph (kopf, the kubernetes client, the handlers) on it
imports=$(in_readonly python -c "import specpilot.operator.kube.handlers; print('imported')" 2>&1) ||
    imports="failed: $imports"
record readonly-imports "$imports"
# no cluster: one error line and exit 2, not kopf retrying a login forever
unreachable_status=0
unreachable=$(in_readonly specpilot operator --standalone --liveness-port 0 --metrics-port 0 \
    --kubeconfig /nonexistent 2>&1) || unreachable_status=$?
record readonly-unreachable "exit $unreachable_status: $unreachable"
cleanup
[ "$status" != 0 ] || { echo "error: the read-only root filesystem was writable" >&2; exit 1; }
echo "$write_out" "$imports" "$unreachable" >>"$LOG"
timing oci-chroot

step "5. sizes"
sizes=$("${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -E "specpilot(-emulator|-base)?:")
layout_bytes=$(du -sb "$WORK/oci/blobs" | cut -f1)
record sizes "$sizes"
record oci-layout-bytes "$layout_bytes"
record dockerfile-sha256 "$(sha256sum "$ROOT/Dockerfile" | cut -d' ' -f1)"
record constraints-sha256 "$(sha256sum "$ROOT/image/constraints.txt" | cut -d' ' -f1)"
echo "total $(($(date +%s) - started_at))" >>"$OUT/timings"

if [ "$MODE" = check ]; then
    # the built image goes (a rebuild would leave it dangling); the base stays in the storage,
    # and the layout and its unpacked copy stay until the next run replaces them
    "${BUILDAH[@]}" rmi "$OPERATOR" >/dev/null
    echo "checked; facts in $OUT" >&2
    exit 0
fi

dockerfile_sha=$(cat "$OUT/dockerfile-sha256")
constraints_sha=$(cat "$OUT/constraints-sha256")
{
    echo "# Image build record"
    echo
    echo "Written by \`make image\` (image/build.sh) on $(date -u +%Y-%m-%dT%H:%M:%SZ); buildah"
    echo "$(buildah --version | cut -d' ' -f3), $STORAGE storage, chroot isolation, over a Debian bookworm"
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
