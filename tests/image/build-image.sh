#!/usr/bin/env bash
# Build the webhook image from the repository's Dockerfile with buildah (no Docker engine needed) and
# write it as an OCI archive, the input of `ctr images import` and of tests/image/.
#
#   tests/image/build-image.sh                    # build what is missing; stdout's last line is the archive
#   ARCHIVE=$(tests/image/build-image.sh | tail -n1)
#   tests/image/build-image.sh --print-archive    # only print the archive path for this tree (no build)
#
# The base is localhost/gpu-webhook-base:bookworm from tests/image/build-base.sh (built when missing), since
# base images cannot be pulled here; GPU_WEBHOOK_IMAGE_BASE=<image> builds FROM another base (the
# Dockerfile's default, the public Python slim image, where it can be pulled).
#
# Output: ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/image/archive/<key>/gpu-webhook.oci.tar, with the
# reference localhost/gpu-webhook:<version> inside. <key> hashes everything that goes into the image:
# Dockerfile, .dockerignore, requirements/image.lock, pyproject.toml, README.md, webhook/ and the base (its
# name and build-base.sh), so an unchanged tree reuses the archive. Progress and timings go to stderr.
#
# Needs root and the Debian packages buildah and debootstrap (skopeo to check the archive, optional).
#
# Environment knobs:
#   GPU_WEBHOOK_CACHE              cache root (default $HOME/.cache/gpu-webhook)
#   GPU_WEBHOOK_IMAGE_BASE         base image of both stages (default: the one build-base.sh makes)
#   GPU_WEBHOOK_BUILDAH_ISOLATION  buildah --isolation for RUN steps (default chroot: the default, oci with
#                                  crun, fails on hosts with hybrid cgroups; chroot RUN steps use the
#                                  host's network)
#   GPU_WEBHOOK_BUILD_CA           CA bundle file mounted into RUN steps for pip, for a TLS-intercepting
#                                  proxy (default: $PIP_CERT when it names a file; never part of the image)
#   PIP_INDEX_URL                  passed to the build when set (a PyPI mirror)
#   GPU_WEBHOOK_BUILD_TIMEOUT      seconds allowed for each step (default 1800)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "${HERE}/../.." && pwd)
log() { printf '[%s] build-image: %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

STEP_TIMEOUT="${GPU_WEBHOOK_BUILD_TIMEOUT:-1800}"
ISOLATION="${GPU_WEBHOOK_BUILDAH_ISOLATION:-chroot}"
DEFAULT_BASE=localhost/gpu-webhook-base:bookworm
BASE="${GPU_WEBHOOK_IMAGE_BASE:-${DEFAULT_BASE}}"
CACHE_ROOT="${GPU_WEBHOOK_CACHE:-${HOME}/.cache/gpu-webhook}"
VERSION=$(sed -nE 's/^__version__ = "([^"]+)"$/\1/p' "${ROOT}/webhook/__init__.py")
[[ -n "${VERSION}" ]] || die "no __version__ in webhook/__init__.py"
REF="localhost/gpu-webhook:${VERSION}"

inputs_key() { # names and contents of every input, in a fixed order
  cd "${ROOT}"
  {
    printf 'base %s\n' "${BASE}"
    [[ "${BASE}" == "${DEFAULT_BASE}" ]] && printf '%s\n' tests/image/build-base.sh
    printf '%s\n' Dockerfile .dockerignore requirements/image.lock pyproject.toml README.md
    find webhook -type f ! -path '*/__pycache__/*' ! -name '*.pyc' | LC_ALL=C sort
  } | while IFS= read -r f; do
    if [[ "${f}" == base\ * ]]; then printf '%s\n' "${f}"; else printf '%s %s\n' "${f}" "$(sha256sum < "${f}" | cut -c1-64)"; fi
  done | sha256sum | cut -c1-16
}
KEY=$(inputs_key)
TOP="${CACHE_ROOT}/image/archive/${KEY}"
ARCHIVE="${TOP}/gpu-webhook.oci.tar"

if [[ "${1:-}" == "--print-archive" ]]; then echo "${ARCHIVE}"; exit 0; fi
[[ $# -eq 0 ]] || die "usage: $0 [--print-archive]"

[[ ${EUID} -eq 0 ]] || die "run as root (buildah's chroot isolation needs it)"
command -v buildah >/dev/null || die "buildah not found: apt-get install -y buildah debootstrap"

mkdir -p "${TOP}"
exec 9>"${TOP}/.lock"
flock -w "${STEP_TIMEOUT}" 9 || die "timed out waiting for ${TOP}/.lock"

T0=$(date +%s)
# --- base -------------------------------------------------------------------------------------------
if [[ "${BASE}" == "${DEFAULT_BASE}" ]]; then
  TB=$(date +%s)
  timeout "$(( STEP_TIMEOUT * 2 ))" "${HERE}/build-base.sh" >/dev/null || die "building the base failed"
  BASE_TIME="$(( $(date +%s) - TB ))s"
else
  BASE_TIME="not built (${BASE})"
fi

# --- image ------------------------------------------------------------------------------------------
if [[ -f "${ARCHIVE}" ]]; then
  log "cached archive: ${ARCHIVE} (key ${KEY})"
  IMAGE_TIME="cached"
else
  TI=$(date +%s)
  args=(--isolation "${ISOLATION}" --layers=false --build-arg "BASE=${BASE}" --label "io.gpu-webhook.image.key=${KEY}")
  CA="${GPU_WEBHOOK_BUILD_CA:-${PIP_CERT:-}}"
  if [[ -n "${CA}" ]]; then
    [[ -f "${CA}" ]] || die "GPU_WEBHOOK_BUILD_CA=${CA} is not a file"
    args+=(--volume "$(readlink -f "${CA}"):/run/gpu-webhook-build-ca.crt:ro" --build-arg PIP_CERT=/run/gpu-webhook-build-ca.crt)
  fi
  [[ -n "${PIP_INDEX_URL:-}" ]] && args+=(--build-arg "PIP_INDEX_URL=${PIP_INDEX_URL}")
  old=$(buildah inspect --type image --format '{{.FromImageID}}' "${REF}" 2>/dev/null || true)
  log "buildah bud ${args[*]} -t ${REF} ${ROOT}"
  timeout "${STEP_TIMEOUT}" buildah bud "${args[@]}" -t "${REF}" -f "${ROOT}/Dockerfile" "${ROOT}" >&2 \
    || die "buildah bud failed"
  new=$(buildah inspect --type image --format '{{.FromImageID}}' "${REF}")
  # The previous build of this tag is now untagged: remove it (and only it) from the store.
  [[ -n "${old}" && "${old}" != "${new}" ]] && { buildah rmi "${old}" >/dev/null 2>&1 || true; }
  log "pushing ${REF} to oci-archive:${ARCHIVE}"
  rm -f "${ARCHIVE}.tmp"
  timeout "${STEP_TIMEOUT}" buildah push --quiet "${REF}" "oci-archive:${ARCHIVE}.tmp:${REF}" >&2 \
    || die "buildah push to the OCI archive failed"
  mv -f "${ARCHIVE}.tmp" "${ARCHIVE}"
  IMAGE_TIME="$(( $(date +%s) - TI ))s"
  # Keep the three newest archives (about 100 MB each); skip any another build still holds.
  while IFS= read -r dir; do
    ( flock -n 7 && rm -rf "${dir}" && log "removed old archive ${dir}" ) 7>"${dir}/.lock" || true
  done < <(ls -1dt "${CACHE_ROOT}/image/archive"/*/ | tail -n +4)
fi

# --- check and report -------------------------------------------------------------------------------
if command -v skopeo >/dev/null; then
  config=$(timeout 300 skopeo inspect --config "oci-archive:${ARCHIVE}") || die "skopeo cannot read ${ARCHIVE}"
  summary=$(python3 -c 'import json, sys
c = json.load(sys.stdin)["config"]
print("user", c.get("User"), "entrypoint", c.get("Entrypoint"), "cmd", c.get("Cmd"))' <<<"${config}")
  log "archive config: ${summary}"
fi
# Layer sizes, compressed (from the manifest) and unpacked (streamed through gzip once, a few seconds).
sizes=$(timeout 300 python3 - "${ARCHIVE}" <<'PY'
import gzip, json, sys, tarfile
with tarfile.open(sys.argv[1]) as tar:
    def blob(desc):
        return tar.extractfile("blobs/" + desc["digest"].replace(":", "/"))
    index = json.load(tar.extractfile("index.json"))
    manifest = json.load(blob(index["manifests"][0]))
    packed = unpacked = 0
    for layer in manifest["layers"]:
        packed += layer["size"]
        stream = blob(layer)
        if layer["mediaType"].endswith("gzip"):
            stream = gzip.GzipFile(fileobj=stream)
        while chunk := stream.read(1 << 20):
            unpacked += len(chunk)
print(f"{len(manifest['layers'])} layers, {packed / 1e6:.0f} MB compressed, {unpacked / 1e6:.0f} MB unpacked")
PY
) || die "cannot read the layers of ${ARCHIVE}"
log "timings: base ${BASE_TIME}, image ${IMAGE_TIME}, total $(( $(date +%s) - T0 ))s"
log "image ${REF}: ${sizes}; archive $(du -h "${ARCHIVE}" | cut -f1)"
echo "${ARCHIVE}"
