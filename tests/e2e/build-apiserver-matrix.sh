#!/usr/bin/env bash
# Build kube-apiserver alone (no scheduler, kubectl, controller-manager) at every version of
# MATRIX_KUBERNETES_VERSIONS in tests/e2e/versions.env, for the e2e version matrix (fixture `matrix_cluster` in
# tests/e2e/conftest.py). The beds run them against the main control plane's etcd binary (build-control-plane.sh).
#
#   tests/e2e/build-apiserver-matrix.sh               # build what is missing
#   tests/e2e/build-apiserver-matrix.sh v1.30.14      # only the named versions (each must be in the list)
#
# Output, one directory per version:
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/control-plane/apiserver-<version>/bin/kube-apiserver
# with its generated Go module in .../apiserver-<version>/build/kubernetes. A present binary is reused.
# Progress and per-version times go to stderr; stdout is one line per version: its bin dir.
#
# Environment knobs (GPU_WEBHOOK_CACHE, GPU_WEBHOOK_BUILD_JOBS, GPU_WEBHOOK_BUILD_TIMEOUT, GO): see go-build.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=build-apiserver-matrix.sh
# shellcheck source=tests/e2e/go-build.sh
source "${HERE}/go-build.sh"

read_versions
read -ra MATRIX <<<"${MATRIX_KUBERNETES_VERSIONS:-}"
(( ${#MATRIX[@]} > 0 )) || die "MATRIX_KUBERNETES_VERSIONS is empty in ${VERSIONS_FILE}"
if (( $# > 0 )); then
  for wanted in "$@"; do
    [[ " ${MATRIX[*]} " == *" ${wanted} "* ]] || die "${wanted} is not in MATRIX_KUBERNETES_VERSIONS (${MATRIX[*]})"
  done
  MATRIX=("$@")
fi
find_go

T0=$(date +%s)
log "apiserver matrix: ${MATRIX[*]} ($("${GO}" version), jobs=${JOBS})"
declare -a DIRS=()
for version in "${MATRIX[@]}"; do
  use_kubernetes_version "${version}"
  TOP="${CACHE_ROOT}/control-plane/apiserver-${version}"
  BIN="${TOP}/bin"
  BUILD="${TOP}/build"
  cache_dir "${TOP}/.lock" "${BIN}" "${BUILD}"  # a second lock call releases the previous version's lock
  if [[ -x "${BIN}/kube-apiserver" ]]; then
    log "cached: ${BIN}/kube-apiserver"
    TIMES[${version}/total]=cached
  else
    start=$(date +%s)
    KDIR="${BUILD}/kubernetes"
    log "${version}: fetching k8s.io/kubernetes@${version}"
    kubernetes_module "${KDIR}" "apiserver-matrix/${version}"
    timed "${version}/go-get" gorun "${KDIR}" get "k8s.io/kubernetes/cmd/kube-apiserver@${version}" \
      || die "go get for kubernetes ${version} failed"
    build_one kube-apiserver "${KDIR}" k8s.io/kubernetes/cmd/kube-apiserver "$(kubernetes_ldflags)" "${KUBERNETES_TAGS}"
    TIMES[${version}/kube-apiserver]=${TIMES[kube-apiserver]}
    unset 'TIMES[kube-apiserver]'  # build_one's label, the same for every version
    TIMES[${version}/total]="$(( $(date +%s) - start ))s"
    log "${version}: kube-apiserver ready in ${TIMES[${version}/total]} (module, go get and build)"
  fi
  [[ -x "${BIN}/kube-apiserver" ]] || die "missing ${BIN}/kube-apiserver after build"
  DIRS+=("${BIN}")
done

for k in $(printf '%s\n' "${!TIMES[@]}" | sort); do log "  ${k}: ${TIMES[${k}]}"; done
log "done in $(( $(date +%s) - T0 ))s"
printf '%s\n' "${DIRS[@]}"
