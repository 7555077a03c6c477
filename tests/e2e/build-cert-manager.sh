#!/usr/bin/env bash
# Build cert-manager's controller and cainjector for the node bed (tests/e2e/test_node_cert_manager.py), from the
# Go module proxy into a cache directory, the way build-control-plane.sh builds the control plane, and copy its
# CustomResourceDefinitions beside them:
#
#   cert-manager-controller, cert-manager-cainjector   github.com/cert-manager/cert-manager (CERT_MANAGER_VERSION)
#   crds/*.yaml                                        deploy/crds of the same module
#
# cert-manager's own admission webhook is not built: it only validates cert-manager's objects, and the chart's
# certs.mode=cert-manager needs the controller (issues and renews) and the cainjector (fills caBundle).
#
#   tests/e2e/build-cert-manager.sh          # build what is missing; stdout is only the bin dir
#
# Output: ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/cert-manager/<version>/bin/{cert-manager-*,crds/}
# Environment knobs (GPU_WEBHOOK_CACHE, GPU_WEBHOOK_BUILD_JOBS, GPU_WEBHOOK_BUILD_TIMEOUT, GO): see go-build.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=build-cert-manager.sh
# shellcheck source=tests/e2e/go-build.sh
source "${HERE}/go-build.sh"

read_versions
: "${CERT_MANAGER_VERSION:?set in versions.env}"
MODULE=github.com/cert-manager/cert-manager
TOP="${CACHE_ROOT}/cert-manager/${CERT_MANAGER_VERSION}"
BIN="${TOP}/bin"
BUILD="${TOP}/build"
find_go
cache_dir "${TOP}/.lock" "${BIN}/crds" "${BUILD}"

T0=$(date +%s)
log "cert-manager ${CERT_MANAGER_VERSION} -> ${BIN} ($("${GO}" version), jobs=${JOBS})"

if need_any cert-manager-controller cert-manager-cainjector; then
  CDIR="${BUILD}/cert-manager"
  # The module's one replace (an older miekg/dns for its ACME DNS solvers) must be repeated: Go ignores a
  # dependency's replaces.
  new_module "${CDIR}" cert-manager "${MODULE}" "${CERT_MANAGER_VERSION}" \
    $'\tgithub.com/miekg/dns v1.1.41 => github.com/miekg/dns v1.1.34\n'
  log "cert-manager: resolving dependencies (go get)"
  timed cert-manager-go-get gorun "${CDIR}" get \
    "${MODULE}/cmd/controller@${CERT_MANAGER_VERSION}" "${MODULE}/cmd/cainjector@${CERT_MANAGER_VERSION}" \
    || die "go get for cert-manager failed"
  # As upstream's release build stamps it (pkg/util/version.go).
  CLDFLAGS="-X ${MODULE}/pkg/util.AppVersion=${CERT_MANAGER_VERSION}"
  build_one cert-manager-controller "${CDIR}" "${MODULE}/cmd/controller" "${CLDFLAGS}"
  build_one cert-manager-cainjector "${CDIR}" "${MODULE}/cmd/cainjector" "${CLDFLAGS}"
else
  all_cached cert-manager-controller cert-manager-cainjector
fi

if ! compgen -G "${BIN}/crds/crd-*.yaml" >/dev/null; then
  SRC=$(mod_download_field "${MODULE}" "${CERT_MANAGER_VERSION}" Dir)
  [[ -d "${SRC}/deploy/crds" ]] || die "no deploy/crds in ${SRC}"
  cp "${SRC}"/deploy/crds/crd-*.yaml "${BIN}/crds/"
  chmod u+w "${BIN}"/crds/*.yaml
  log "copied $(ls "${BIN}/crds" | wc -l) CRDs from ${MODULE}@${CERT_MANAGER_VERSION}"
fi

echo "CERT_MANAGER_VERSION=${CERT_MANAGER_VERSION}" > "${TOP}/versions.txt"
finish cert-manager-controller cert-manager-cainjector
