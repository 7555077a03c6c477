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
# Environment knobs:
#   GPU_WEBHOOK_CACHE          cache root (default $HOME/.cache/gpu-webhook)
#   GPU_WEBHOOK_BUILD_JOBS     parallel compile jobs, go build -p (default 2)
#   GPU_WEBHOOK_BUILD_TIMEOUT  seconds allowed for each go command (default 5400)
#   GO                         go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VERSIONS_FILE="${HERE}/versions.env"

log() { printf '[%s] %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- versions ---------------------------------------------------------------
[[ -f "${VERSIONS_FILE}" ]] || die "missing ${VERSIONS_FILE}"
# Parse KEY=value lines ourselves (no `source`), the same way Python does.
while IFS= read -r line || [[ -n "${line}" ]]; do
  line="${line%%#*}"
  line="${line#"${line%%[![:space:]]*}"}"
  line="${line%"${line##*[![:space:]]}"}"
  [[ -z "${line}" ]] && continue
  [[ "${line}" =~ ^([A-Z_][A-Z0-9_]*)=(.*)$ ]] || die "bad line in ${VERSIONS_FILE}: ${line}"
  case "${BASH_REMATCH[1]}" in
    KUBERNETES_VERSION|ETCD_VERSION|HELM_VERSION|GOTOOLCHAIN)
      printf -v "${BASH_REMATCH[1]}" '%s' "${BASH_REMATCH[2]}"
      export "${BASH_REMATCH[1]}" ;;
    CONTAINERD_VERSION|CNI_PLUGINS_VERSION) ;;  # build-node.sh's
    *) log "warning: ignoring unknown key ${BASH_REMATCH[1]} in ${VERSIONS_FILE}" ;;
  esac
done < "${VERSIONS_FILE}"
: "${KUBERNETES_VERSION:?set in versions.env}" "${ETCD_VERSION:?set in versions.env}" "${HELM_VERSION:?set in versions.env}"

[[ "${KUBERNETES_VERSION}" =~ ^v1\.([0-9]+)\.([0-9]+)(-[0-9A-Za-z.-]+)?$ ]] \
  || die "KUBERNETES_VERSION must look like v1.36.3, got ${KUBERNETES_VERSION}"
K8S_MINOR="${BASH_REMATCH[1]}"
[[ -n "${BASH_REMATCH[3]}" ]] && K8S_MINOR+="+"
STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"   # v1.36.3 -> v0.36.3

case "${HELM_VERSION}" in
  v4.*) HELM_MODULE=helm.sh/helm/v4 ;;
  v3.*) HELM_MODULE=helm.sh/helm/v3 ;;
  *) die "HELM_VERSION must be v3.x or v4.x, got ${HELM_VERSION}" ;;
esac

# --- paths and go -----------------------------------------------------------
CACHE_ROOT="${GPU_WEBHOOK_CACHE:-${HOME}/.cache/gpu-webhook}"
KEY="${KUBERNETES_VERSION}-${ETCD_VERSION}-${HELM_VERSION}"
TOP="${CACHE_ROOT}/control-plane/${KEY}"
BIN="${TOP}/bin"
BUILD="${TOP}/build"
JOBS="${GPU_WEBHOOK_BUILD_JOBS:-2}"
STEP_TIMEOUT="${GPU_WEBHOOK_BUILD_TIMEOUT:-5400}"

if [[ -z "${GO:-}" ]]; then
  GO=$(command -v go || true)
  [[ -n "${GO}" ]] || GO=/usr/local/go/bin/go
fi
[[ -x "${GO}" ]] || die "go not found (set GO=/path/to/go)"

export CGO_ENABLED=0 GOWORK=off GO111MODULE=on
[[ -n "${GOTOOLCHAIN:-}" ]] && export GOTOOLCHAIN

mkdir -p "${BIN}" "${BUILD}"

# One build at a time per cache (parallel pytest workers may call us at once).
exec 9>"${TOP}/.lock"
if command -v flock >/dev/null; then
  flock -w "${STEP_TIMEOUT}" 9 || die "timed out waiting for lock ${TOP}/.lock"
fi

gorun() { # run a go command, bounded in time, inside a module dir: gorun DIR args...
  local dir=$1; shift
  (cd "${dir}" && timeout "${STEP_TIMEOUT}" "${GO}" "$@")
}

mod_download_field() { # mod_download_field MODULE VERSION FIELD: a path from `go mod download -json`
  local out
  out=$(cd "${BUILD}" && timeout 900 "${GO}" mod download -json "$1@$2") \
    || die "go mod download $1@$2 failed: ${out}"
  sed -nE "s/^[[:space:]]*\"$3\": \"(.*)\",?\$/\1/p" <<<"${out}"
}
go_mod_file() { mod_download_field "$1" "$2" GoMod; }   # cached go.mod of MODULE@VERSION

go_directive() { sed -nE 's/^go ([0-9.]+).*$/\1/p' "$1" | head -n1; }

module_time() { # tag time of MODULE@VERSION (from the proxy's .info), used as buildDate
  local info
  info=$(mod_download_field "$1" "$2" Info)
  sed -nE 's/.*"Time":"([^"]+)".*/\1/p' "${info}"
}

declare -A TIMES=()
build_one() { # build_one NAME MODDIR PACKAGE LDFLAGS [TAGS]
  local name=$1 dir=$2 pkg=$3 ldflags=$4 tags=${5:-} start end
  if [[ -x "${BIN}/${name}" ]]; then
    log "cached: ${BIN}/${name}"
    TIMES[${name}]=cached
    return 0
  fi
  log "building ${name} from ${pkg} (go build -p ${JOBS}; a cold build takes minutes)"
  start=$(date +%s)
  gorun "${dir}" build -p "${JOBS}" -trimpath ${tags:+-tags="${tags}"} \
    -ldflags "-s -w ${ldflags}" -o "${BIN}/.${name}.tmp" "${pkg}" \
    || die "building ${name} failed (see go output above)"
  mv -f "${BIN}/.${name}.tmp" "${BIN}/${name}"
  end=$(date +%s)
  TIMES[${name}]="$((end - start))s"
  log "built ${name} in $((end - start))s ($(du -h "${BIN}/${name}" | cut -f1))"
}

need_any() { local b; for b; do [[ -x "${BIN}/${b}" ]] || return 0; done; return 1; }

T0=$(date +%s)
log "control plane ${KEY} -> ${BIN} ($("${GO}" version), jobs=${JOBS})"

# --- kubernetes: kube-apiserver, kube-scheduler, kube-controller-manager, kubectl
if need_any kube-apiserver kube-scheduler kube-controller-manager kubectl; then
  KDIR="${BUILD}/kubernetes"
  mkdir -p "${KDIR}"
  log "kubernetes: fetching k8s.io/kubernetes@${KUBERNETES_VERSION} (module zip is ~60 MB on first use)"
  KMOD=$(go_mod_file k8s.io/kubernetes "${KUBERNETES_VERSION}")
  [[ -f "${KMOD}" ]] || die "no go.mod for k8s.io/kubernetes@${KUBERNETES_VERSION}"
  # Every staging module that upstream replaces with ./staging/src/k8s.io/X must be
  # replaced here with its published k8s.io/X v0.N.M (Go ignores a dependency's replaces).
  mapfile -t STAGING < <(sed -nE 's#^[[:space:]]*(replace[[:space:]]+)?(k8s\.io/[^[:space:]]+)[[:space:]]+=>[[:space:]]+\./staging/.*#\2#p' "${KMOD}" | sort -u)
  (( ${#STAGING[@]} > 0 )) || die "found no staging replaces in ${KMOD}"
  log "kubernetes: generating module with ${#STAGING[@]} staging replaces at ${STAGING_VERSION}"
  {
    echo "// Generated by tests/e2e/build-control-plane.sh; do not edit."
    echo "module gpu-webhook.invalid/control-plane/kubernetes"
    echo
    echo "go $(go_directive "${KMOD}")"
    echo
    grep -E '^godebug ' "${KMOD}" || true
    echo
    echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
    echo
    echo "replace ("
    for m in "${STAGING[@]}"; do printf '\t%s => %s %s\n' "${m}" "${m}" "${STAGING_VERSION}"; done
    echo ")"
  } > "${KDIR}/go.mod.new"
  if ! cmp -s "${KDIR}/go.mod.new" "${KDIR}/go.mod.gen" 2>/dev/null; then
    mv -f "${KDIR}/go.mod.new" "${KDIR}/go.mod.gen"
    cp "${KDIR}/go.mod.gen" "${KDIR}/go.mod"
    rm -f "${KDIR}/go.sum"
  else
    rm -f "${KDIR}/go.mod.new"
  fi
  log "kubernetes: resolving dependencies (go get)"
  gorun "${KDIR}" get \
    "k8s.io/kubernetes/cmd/kube-apiserver@${KUBERNETES_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-scheduler@${KUBERNETES_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@${KUBERNETES_VERSION}" \
    "k8s.io/kubernetes/cmd/kubectl@${KUBERNETES_VERSION}" \
    || die "go get for kubernetes failed"
  KDATE=$(module_time k8s.io/kubernetes "${KUBERNETES_VERSION}")
  KLDFLAGS=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    KLDFLAGS+=" -X ${p}.gitVersion=${KUBERNETES_VERSION} -X ${p}.gitMajor=1 -X ${p}.gitMinor=${K8S_MINOR}"
    KLDFLAGS+=" -X ${p}.gitTreeState=clean -X ${p}.buildDate=${KDATE:-1970-01-01T00:00:00Z} -X ${p}.gitCommit="
  done
  # Same build tags as upstream's hack/lib/golang.sh for non-debug static binaries.
  KTAGS="selinux,notest,grpcnotrace"
  build_one kube-apiserver "${KDIR}" k8s.io/kubernetes/cmd/kube-apiserver "${KLDFLAGS}" "${KTAGS}"
  build_one kube-scheduler "${KDIR}" k8s.io/kubernetes/cmd/kube-scheduler "${KLDFLAGS}" "${KTAGS}"
  build_one kubectl        "${KDIR}" k8s.io/kubernetes/cmd/kubectl        "${KLDFLAGS}" "${KTAGS}"
  # The DRA tests need its resourceclaim controller (claims from ResourceClaimTemplates).
  build_one kube-controller-manager "${KDIR}" k8s.io/kubernetes/cmd/kube-controller-manager "${KLDFLAGS}" "${KTAGS}"
else
  for b in kube-apiserver kube-scheduler kube-controller-manager kubectl; do log "cached: ${BIN}/${b}"; TIMES[${b}]=cached; done
fi

# --- etcd -------------------------------------------------------------------
if need_any etcd; then
  EDIR="${BUILD}/etcd"
  mkdir -p "${EDIR}"
  log "etcd: fetching go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
  EMOD=$(go_mod_file go.etcd.io/etcd/server/v3 "${ETCD_VERSION}")
  # server/v3's own replaces (../api, ...) are ignored; its requires name the
  # published sibling modules at the same version, so no replaces are needed.
  cat > "${EDIR}/go.mod" <<EOF
// Generated by tests/e2e/build-control-plane.sh; do not edit.
module gpu-webhook.invalid/control-plane/etcd

go $(go_directive "${EMOD}")

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
EOF
  log "etcd: resolving dependencies (go get)"
  gorun "${EDIR}" get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" || die "go get for etcd failed"
  # The version string is a constant in go.etcd.io/etcd/api/v3/version; only the git SHA is an ldflag.
  build_one etcd "${EDIR}" go.etcd.io/etcd/server/v3 ""
else
  log "cached: ${BIN}/etcd"; TIMES[etcd]=cached
fi

# --- helm -------------------------------------------------------------------
if need_any helm; then
  HDIR="${BUILD}/helm"
  mkdir -p "${HDIR}"
  log "helm: fetching ${HELM_MODULE}@${HELM_VERSION}"
  HMOD=$(go_mod_file "${HELM_MODULE}" "${HELM_VERSION}")
  cat > "${HDIR}/go.mod" <<EOF
// Generated by tests/e2e/build-control-plane.sh; do not edit.
module gpu-webhook.invalid/control-plane/helm

go $(go_directive "${HMOD}")

require ${HELM_MODULE} ${HELM_VERSION}
EOF
  log "helm: resolving dependencies (go get)"
  gorun "${HDIR}" get "${HELM_MODULE}/cmd/helm@${HELM_VERSION}" || die "go get for helm failed"
  # As upstream's Makefile does for a tagged release (metadata empty = released).
  HLDFLAGS="-X ${HELM_MODULE}/internal/version.version=${HELM_VERSION}"
  HLDFLAGS+=" -X ${HELM_MODULE}/internal/version.metadata="
  HLDFLAGS+=" -X ${HELM_MODULE}/internal/version.gitTreeState=clean"
  build_one helm "${HDIR}" "${HELM_MODULE}/cmd/helm" "${HLDFLAGS}"
else
  log "cached: ${BIN}/helm"; TIMES[helm]=cached
fi

# --- summary ----------------------------------------------------------------
cat > "${TOP}/versions.txt" <<EOF
KUBERNETES_VERSION=${KUBERNETES_VERSION}
ETCD_VERSION=${ETCD_VERSION}
HELM_VERSION=${HELM_VERSION}
EOF
for b in kube-apiserver kube-scheduler kube-controller-manager kubectl etcd helm; do
  [[ -x "${BIN}/${b}" ]] || die "missing ${BIN}/${b} after build"
  log "  ${b}: ${TIMES[${b}]:-?}"
done
log "done in $(( $(date +%s) - T0 ))s"
echo "${BIN}"
