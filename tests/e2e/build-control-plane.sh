#!/usr/bin/env bash
# Build real upstream control-plane binaries (kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl, etcd, helm) from the Go module proxy into a cache directory.
#
#   tests/e2e/build-control-plane.sh          # build what is missing
#   BIN=$(tests/e2e/build-control-plane.sh)   # stdout is only the bin dir
#
# Versions come from tests/e2e/versions.env. Output:
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/control-plane/<k8s>-<etcd>-<helm>/bin/
# Generated Go modules (one per tool) live next to it in .../build/.
# Progress goes to stderr with timestamps; the bin dir is the last line of stdout.
#
# Environment knobs (GPU_WEBHOOK_CACHE, GPU_WEBHOOK_BUILD_JOBS, GPU_WEBHOOK_BUILD_TIMEOUT, GO): see go-build.sh,
# the helpers this script shares with build-node.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=build-control-plane.sh
# shellcheck source=tests/e2e/go-build.sh
source "${HERE}/go-build.sh"

read_versions
: "${ETCD_VERSION:?set in versions.env}" "${HELM_VERSION:?set in versions.env}"
case "${HELM_VERSION}" in
  v4.*) HELM_MODULE=helm.sh/helm/v4 ;;
  v3.*) HELM_MODULE=helm.sh/helm/v3 ;;
  *) die "HELM_VERSION must be v3.x or v4.x, got ${HELM_VERSION}" ;;
esac

KEY="${KUBERNETES_VERSION}-${ETCD_VERSION}-${HELM_VERSION}"
TOP="${CACHE_ROOT}/control-plane/${KEY}"
BIN="${TOP}/bin"
BUILD="${TOP}/build"
find_go
cache_dir "${TOP}/.lock" "${BIN}" "${BUILD}"  # parallel pytest workers may call us at once

T0=$(date +%s)
log "control plane ${KEY} -> ${BIN} ($("${GO}" version), jobs=${JOBS})"

# --- kubernetes: kube-apiserver, kube-scheduler, kube-controller-manager, kubectl
if need_any kube-apiserver kube-scheduler kube-controller-manager kubectl; then
  KDIR="${BUILD}/kubernetes"
  log "kubernetes: fetching k8s.io/kubernetes@${KUBERNETES_VERSION} (module zip is ~60 MB on first use)"
  kubernetes_module "${KDIR}" control-plane/kubernetes
  log "kubernetes: resolving dependencies (go get)"
  timed kubernetes-go-get gorun "${KDIR}" get \
    "k8s.io/kubernetes/cmd/kube-apiserver@${KUBERNETES_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-scheduler@${KUBERNETES_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@${KUBERNETES_VERSION}" \
    "k8s.io/kubernetes/cmd/kubectl@${KUBERNETES_VERSION}" \
    || die "go get for kubernetes failed"
  KLDFLAGS=$(kubernetes_ldflags)
  KTAGS="${KUBERNETES_TAGS}"
  build_one kube-apiserver "${KDIR}" k8s.io/kubernetes/cmd/kube-apiserver "${KLDFLAGS}" "${KTAGS}"
  build_one kube-scheduler "${KDIR}" k8s.io/kubernetes/cmd/kube-scheduler "${KLDFLAGS}" "${KTAGS}"
  build_one kubectl        "${KDIR}" k8s.io/kubernetes/cmd/kubectl        "${KLDFLAGS}" "${KTAGS}"
  # The DRA tests need its resourceclaim controller (claims from ResourceClaimTemplates).
  build_one kube-controller-manager "${KDIR}" k8s.io/kubernetes/cmd/kube-controller-manager "${KLDFLAGS}" "${KTAGS}"
else
  all_cached kube-apiserver kube-scheduler kube-controller-manager kubectl
fi

# --- etcd -------------------------------------------------------------------
if need_any etcd; then
  EDIR="${BUILD}/etcd"
  log "etcd: fetching go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
  # server/v3's own replaces (../api, ...) are ignored; its requires name the
  # published sibling modules at the same version, so no replaces are needed.
  new_module "${EDIR}" control-plane/etcd go.etcd.io/etcd/server/v3 "${ETCD_VERSION}"
  log "etcd: resolving dependencies (go get)"
  timed etcd-go-get gorun "${EDIR}" get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" || die "go get for etcd failed"
  # The version string is a constant in go.etcd.io/etcd/api/v3/version; only the git SHA is an ldflag.
  build_one etcd "${EDIR}" go.etcd.io/etcd/server/v3 ""
else
  all_cached etcd
fi

# --- helm -------------------------------------------------------------------
if need_any helm; then
  HDIR="${BUILD}/helm"
  log "helm: fetching ${HELM_MODULE}@${HELM_VERSION}"
  new_module "${HDIR}" control-plane/helm "${HELM_MODULE}" "${HELM_VERSION}"
  log "helm: resolving dependencies (go get)"
  timed helm-go-get gorun "${HDIR}" get "${HELM_MODULE}/cmd/helm@${HELM_VERSION}" || die "go get for helm failed"
  # As upstream's Makefile does for a tagged release (metadata empty = released).
  HLDFLAGS="-X ${HELM_MODULE}/internal/version.version=${HELM_VERSION}"
  HLDFLAGS+=" -X ${HELM_MODULE}/internal/version.metadata="
  HLDFLAGS+=" -X ${HELM_MODULE}/internal/version.gitTreeState=clean"
  build_one helm "${HDIR}" "${HELM_MODULE}/cmd/helm" "${HLDFLAGS}"
else
  all_cached helm
fi

# --- summary ----------------------------------------------------------------
cat > "${TOP}/versions.txt" <<EOF
KUBERNETES_VERSION=${KUBERNETES_VERSION}
ETCD_VERSION=${ETCD_VERSION}
HELM_VERSION=${HELM_VERSION}
EOF
finish kube-apiserver kube-scheduler kube-controller-manager kubectl etcd helm
