#!/usr/bin/env bash
# Build the test base image from Debian packages: registries of base images cannot be reached from the
# machines this project is tested on, so instead of the public Python slim image the image is built FROM
# a Debian bookworm (minbase) root filesystem made by debootstrap and imported into buildah's store.
#
#   tests/image/build-base.sh               # build what is missing, stdout's last line is the image name
#   BASE=$(tests/image/build-base.sh | tail -n1)
#
# Output:
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/image/base/<key>/rootfs.tar   the debootstrapped tree
#   localhost/gpu-webhook-base:bookworm in buildah's store, labelled io.gpu-webhook.base.key=<key>
# <key> hashes this script and the knobs below; an unchanged key reuses the tarball and the imported image.
# The packages are whatever the mirror serves on the first (cold) build: delete the key's directory to
# pick up newer Debian updates.
#
# Needs root and the Debian packages buildah and debootstrap. Progress goes to stderr.
#
# Environment knobs:
#   GPU_WEBHOOK_CACHE            cache root (default $HOME/.cache/gpu-webhook)
#   GPU_WEBHOOK_DEBIAN_MIRROR    Debian mirror URL (default: the first Debian archive URI in this host's apt sources)
#   GPU_WEBHOOK_BUILD_TIMEOUT    seconds allowed for each step (default 1800)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { printf '[%s] build-base: %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

SUITE=bookworm
VARIANT=minbase
# python3-venv: the builder stage makes the venv with it (ensurepip); ca-certificates: pip over HTTPS.
PACKAGES=python3,python3-venv,ca-certificates
IMAGE=localhost/gpu-webhook-base:${SUITE}
STEP_TIMEOUT="${GPU_WEBHOOK_BUILD_TIMEOUT:-1800}"
ARCH=$(dpkg --print-architecture)

[[ ${EUID} -eq 0 ]] || die "run as root (debootstrap and buildah's chroot isolation need it)"
for tool in buildah debootstrap; do
  command -v "${tool}" >/dev/null || die "${tool} not found: apt-get install -y buildah debootstrap"
done

debian_mirror() { # the host's own Debian archive URI, from deb822 or one-line apt sources
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "${f}" ]] || continue
    uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' "${f}")
    [[ -n "${uri}" ]] && { echo "${uri}"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "${f}" ]] || continue
    uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) { print $i; exit } }' "${f}")
    [[ -n "${uri}" ]] && { echo "${uri}"; return; }
  done
}
MIRROR="${GPU_WEBHOOK_DEBIAN_MIRROR:-$(debian_mirror)}"

CACHE_ROOT="${GPU_WEBHOOK_CACHE:-${HOME}/.cache/gpu-webhook}"
KEY=$( { cat "${BASH_SOURCE[0]}"; printf '%s\n' "${SUITE}" "${VARIANT}" "${PACKAGES}" "${ARCH}"; } | sha256sum | cut -c1-16)
TOP="${CACHE_ROOT}/image/base/${KEY}"
TARBALL="${TOP}/rootfs.tar"
mkdir -p "${TOP}"

# One build at a time per key.
exec 8>"${TOP}/.lock"
flock -w "${STEP_TIMEOUT}" 8 || die "timed out waiting for ${TOP}/.lock"

T0=$(date +%s)
if [[ -f "${TARBALL}" ]]; then
  log "cached rootfs: ${TARBALL}"
else
  [[ -n "${MIRROR}" ]] || die "no Debian mirror found in apt sources: set GPU_WEBHOOK_DEBIAN_MIRROR"
  ROOTFS="${TOP}/rootfs.tmp"
  rm -rf "${ROOTFS}" "${TARBALL}.tmp"
  log "debootstrap --variant=${VARIANT} --include=${PACKAGES} ${SUITE} (${ARCH}) from ${MIRROR}"
  timeout "${STEP_TIMEOUT}" debootstrap --variant="${VARIANT}" --include="${PACKAGES}" --arch="${ARCH}" \
    "${SUITE}" "${ROOTFS}" "${MIRROR}" >&2 || die "debootstrap failed (log: ${ROOTFS}/debootstrap/debootstrap.log)"
  # What an image does not need: package caches and lists, logs, device nodes (the runtime provides /dev).
  # The standard library's bytecode stays: a read-only root filesystem cannot write it later.
  rm -rf "${ROOTFS}"/var/cache/apt/*.bin "${ROOTFS}"/var/cache/apt/archives/*.deb \
    "${ROOTFS}"/var/lib/apt/lists/* "${ROOTFS}"/var/log/* "${ROOTFS}"/tmp/* "${ROOTFS}"/dev/*
  timeout "${STEP_TIMEOUT}" tar --numeric-owner --xattrs --sort=name -C "${ROOTFS}" -cf "${TARBALL}.tmp" . \
    || die "tar of the rootfs failed"
  mv -f "${TARBALL}.tmp" "${TARBALL}"
  rm -rf "${ROOTFS}"
  log "rootfs built in $(( $(date +%s) - T0 ))s ($(du -h "${TARBALL}" | cut -f1))"
fi

have=$(buildah inspect --type image --format '{{index .ImageAnnotations "io.gpu-webhook.base.key"}}' "${IMAGE}" 2>/dev/null || true)
if [[ "${have}" == "${KEY}" ]]; then
  log "cached image: ${IMAGE} (key ${KEY})"
else
  T1=$(date +%s)
  log "importing ${TARBALL} as ${IMAGE}"
  ctr=$(buildah from scratch)
  trap 'buildah rm "${ctr}" >/dev/null 2>&1 || true' EXIT
  mnt=$(buildah mount "${ctr}")
  timeout "${STEP_TIMEOUT}" tar --numeric-owner --xattrs -xpf "${TARBALL}" -C "${mnt}" || die "unpacking the rootfs failed"
  buildah umount "${ctr}" >/dev/null
  buildah config --os linux --arch "${ARCH}" \
    --env LANG=C.UTF-8 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd python3 --annotation "io.gpu-webhook.base.key=${KEY}" --label "io.gpu-webhook.base.key=${KEY}" \
    --label "io.gpu-webhook.base.packages=${PACKAGES}" "${ctr}"
  buildah commit --quiet --rm "${ctr}" "${IMAGE}" >/dev/null || die "buildah commit failed"
  trap - EXIT
  log "imported in $(( $(date +%s) - T1 ))s"
fi
log "base ${IMAGE} ready in $(( $(date +%s) - T0 ))s"
echo "${IMAGE}"
