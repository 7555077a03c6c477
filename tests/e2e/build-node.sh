#!/usr/bin/env bash
# Build what a real Kubernetes node needs for the e2e node bed (tests/e2e/node.py), from the Go
# module proxy into a cache directory, the same way build-control-plane.sh builds the control plane:
#
#   kubelet, kube-proxy                           k8s.io/kubernetes (KUBERNETES_VERSION)
#   containerd, containerd-shim-runc-v2, ctr       github.com/containerd/containerd/v2 (CONTAINERD_VERSION)
#   cni/bridge, cni/host-local, cni/loopback       github.com/containernetworking/plugins (CNI_PLUGINS_VERSION)
#   images/pause.oci.tar, images/agent.oci.tar     tests/e2e/images (our own Go programs, packaged by
#                                                  tests/e2e/images/ociarchive.py as single-layer OCI archives)
#
#   tests/e2e/build-node.sh          # build what is missing
#   BIN=$(tests/e2e/build-node.sh)   # stdout is only the bin dir
#   tests/e2e/build-node.sh --print-images-dir   # where the images go (no build)
#
# Output:
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/node/<k8s>-<containerd>-<cni>/bin/{...,cni/}
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/node/images/<hash of tests/e2e/images>/{pause,agent}.oci.tar
# runc is not built: it comes from Debian (`apt-get install runc`), as do iptables, iproute2 and util-linux;
# the script checks they are there. Progress goes to stderr with timestamps; the bin dir is the last line
# of stdout.
#
# Environment knobs (as in build-control-plane.sh):
#   GPU_WEBHOOK_CACHE          cache root (default $HOME/.cache/gpu-webhook)
#   GPU_WEBHOOK_BUILD_JOBS     parallel compile jobs, go build -p (default 2)
#   GPU_WEBHOOK_BUILD_TIMEOUT  seconds allowed for each go command (default 5400)
#   GO                         go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VERSIONS_FILE="${HERE}/versions.env"
IMAGES_SRC="${HERE}/images"

log() { printf '[%s] %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- versions ---------------------------------------------------------------
[[ -f "${VERSIONS_FILE}" ]] || die "missing ${VERSIONS_FILE}"
while IFS= read -r line || [[ -n "${line}" ]]; do
  line="${line%%#*}"
  line="${line#"${line%%[![:space:]]*}"}"
  line="${line%"${line##*[![:space:]]}"}"
  [[ -z "${line}" ]] && continue
  [[ "${line}" =~ ^([A-Z_][A-Z0-9_]*)=(.*)$ ]] || die "bad line in ${VERSIONS_FILE}: ${line}"
  case "${BASH_REMATCH[1]}" in
    KUBERNETES_VERSION|CONTAINERD_VERSION|CNI_PLUGINS_VERSION|GOTOOLCHAIN)
      printf -v "${BASH_REMATCH[1]}" '%s' "${BASH_REMATCH[2]}"
      export "${BASH_REMATCH[1]}" ;;
    *) ;;  # the control plane's keys
  esac
done < "${VERSIONS_FILE}"
: "${KUBERNETES_VERSION:?set in versions.env}" "${CONTAINERD_VERSION:?set in versions.env}"
: "${CNI_PLUGINS_VERSION:?set in versions.env}"

[[ "${KUBERNETES_VERSION}" =~ ^v1\.([0-9]+)\.([0-9]+)(-[0-9A-Za-z.-]+)?$ ]] \
  || die "KUBERNETES_VERSION must look like v1.36.3, got ${KUBERNETES_VERSION}"
K8S_MINOR="${BASH_REMATCH[1]}"
[[ -n "${BASH_REMATCH[3]}" ]] && K8S_MINOR+="+"
STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"   # v1.36.3 -> v0.36.3
[[ "${CONTAINERD_VERSION}" =~ ^v2\. ]] || die "CONTAINERD_VERSION must be a v2.x tag, got ${CONTAINERD_VERSION}"

# --- paths and go -----------------------------------------------------------
CACHE_ROOT="${GPU_WEBHOOK_CACHE:-${HOME}/.cache/gpu-webhook}"
KEY="${KUBERNETES_VERSION}-${CONTAINERD_VERSION}-${CNI_PLUGINS_VERSION}"
TOP="${CACHE_ROOT}/node/${KEY}"
BIN="${TOP}/bin"
BUILD="${TOP}/build"
JOBS="${GPU_WEBHOOK_BUILD_JOBS:-2}"
STEP_TIMEOUT="${GPU_WEBHOOK_BUILD_TIMEOUT:-5400}"

if [[ -z "${GO:-}" ]]; then
  GO=$(command -v go || true)
  [[ -n "${GO}" ]] || GO=/usr/local/go/bin/go
fi
[[ -x "${GO}" ]] || die "go not found (set GO=/path/to/go)"

# The images' cache key: a hash of their sources (tests/e2e/node.py computes the same one).
IMAGES_HASH=$(cd "${IMAGES_SRC}" \
  && find . -type f \( -name '*.go' -o -name go.mod -o -name '*.py' \) -not -path '*/__pycache__/*' \
     | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
IMAGES="${CACHE_ROOT}/node/images/${IMAGES_HASH}"

if [[ "${1:-}" == --print-images-dir ]]; then  # where the images go, without building (tests compare it)
  echo "${IMAGES}"
  exit 0
fi

export CGO_ENABLED=0 GOWORK=off GO111MODULE=on
[[ -n "${GOTOOLCHAIN:-}" ]] && export GOTOOLCHAIN

mkdir -p "${BIN}/cni" "${BUILD}" "${IMAGES}"

exec 9>"${CACHE_ROOT}/node/.lock"
if command -v flock >/dev/null; then
  flock -w "${STEP_TIMEOUT}" 9 || die "timed out waiting for lock ${CACHE_ROOT}/node/.lock"
fi

gorun() { # gorun DIR args...: a go command, bounded in time, inside a module dir
  local dir=$1; shift
  (cd "${dir}" && timeout "${STEP_TIMEOUT}" "${GO}" "$@")
}

mod_download_field() { # mod_download_field MODULE VERSION FIELD: a path from `go mod download -json`
  local out
  out=$(cd "${BUILD}" && timeout 900 "${GO}" mod download -json "$1@$2") \
    || die "go mod download $1@$2 failed: ${out}"
  sed -nE "s/^[[:space:]]*\"$3\": \"(.*)\",?\$/\1/p" <<<"${out}"
}
go_directive() { sed -nE 's/^go ([0-9.]+).*$/\1/p' "$1" | head -n1; }
module_time() { # tag time of MODULE@VERSION, from the proxy's .info
  local info
  info=$(mod_download_field "$1" "$2" Info)
  sed -nE 's/.*"Time":"([^"]+)".*/\1/p' "${info}"
}

new_module() { # new_module DIR NAME MODULE VERSION: a go.mod that requires MODULE@VERSION
  local dir=$1 name=$2 module=$3 version=$4 mod
  mkdir -p "${dir}"
  mod=$(mod_download_field "${module}" "${version}" GoMod)
  [[ -f "${mod}" ]] || die "no go.mod for ${module}@${version}"
  printf '// Generated by tests/e2e/build-node.sh; do not edit.\nmodule gpu-webhook.invalid/node/%s\n\ngo %s\n\nrequire %s %s\n' \
    "${name}" "$(go_directive "${mod}")" "${module}" "${version}" > "${dir}/go.mod.new"
  if ! cmp -s "${dir}/go.mod.new" "${dir}/go.mod.gen" 2>/dev/null; then
    mv -f "${dir}/go.mod.new" "${dir}/go.mod.gen"
    cp "${dir}/go.mod.gen" "${dir}/go.mod"
    rm -f "${dir}/go.sum"
  else
    rm -f "${dir}/go.mod.new"
  fi
}

declare -A TIMES=()
timed() { # timed LABEL command...: run, log and record its wall time; returns the command's status
  local label=$1 start rc=0; shift
  start=$(date +%s)
  "$@" || rc=$?
  TIMES[${label}]="$(( $(date +%s) - start ))s"
  log "${label}: ${TIMES[${label}]}$( ((rc == 0)) || echo " (failed: exit ${rc})")"
  return "${rc}"
}

build_one() { # build_one OUT MODDIR PACKAGE LDFLAGS [TAGS]; OUT relative to BIN
  local out=$1 dir=$2 pkg=$3 ldflags=$4 tags=${5:-} start end tmp
  if [[ -x "${BIN}/${out}" ]]; then
    log "cached: ${BIN}/${out}"
    TIMES[${out}]=cached
    return 0
  fi
  log "building ${out} from ${pkg} (go build -p ${JOBS})"
  start=$(date +%s)
  tmp="$(dirname "${BIN}/${out}")/.$(basename "${out}").tmp"
  gorun "${dir}" build -p "${JOBS}" -trimpath ${tags:+-tags="${tags}"} \
    -ldflags "-s -w ${ldflags}" -o "${tmp}" "${pkg}" \
    || die "building ${out} failed (see go output above)"
  mv -f "${tmp}" "${BIN}/${out}"
  end=$(date +%s)
  TIMES[${out}]="$((end - start))s"
  log "built ${out} in $((end - start))s ($(du -h "${BIN}/${out}" | cut -f1))"
}

need_any() { local b; for b; do [[ -x "${BIN}/${b}" ]] || return 0; done; return 1; }

T0=$(date +%s)
log "node ${KEY} -> ${BIN}, images ${IMAGES_HASH} -> ${IMAGES} ($("${GO}" version), jobs=${JOBS})"

# --- Debian tools the bed runs (not built here) -----------------------------
missing=()
for tool in runc iptables ip nsenter unshare mount umount; do
  command -v "${tool}" >/dev/null || missing+=("${tool}")
done
((${#missing[@]} == 0)) || die "missing ${missing[*]}: apt-get install -y runc iptables iproute2 util-linux mount"

# --- test images: pause (the sandbox image) and agent -------------------------
IMAGE_REFS=(pause agent)
build_image() { # build_image NAME: the static Go program tests/e2e/images/NAME as gw-e2e.invalid/NAME:1
  local name=$1
  gorun "${IMAGES_SRC}" build -p "${JOBS}" -trimpath -ldflags "-s -w" -o "${IMAGES}/${name}" "./${name}" \
    || die "building ${name} failed"
  python3 "${IMAGES_SRC}/ociarchive.py" --ref "gw-e2e.invalid/${name}:1" --out "${IMAGES}/${name}.oci.tar" \
    --entrypoint "/${name}" "${IMAGES}/${name}=/${name}" >&2 || die "packaging ${name} failed"
  rm -f "${IMAGES}/${name}"
}
for name in "${IMAGE_REFS[@]}"; do
  if [[ -f "${IMAGES}/${name}.oci.tar" ]]; then
    log "cached: ${IMAGES}/${name}.oci.tar"; TIMES[image-${name}]=cached
  else
    timed "image-${name}" build_image "${name}"
  fi
done

# --- CNI plugins ----------------------------------------------------------------
CNI_PLUGINS=(main/bridge ipam/host-local main/loopback)
if need_any cni/bridge cni/host-local cni/loopback; then
  CDIR="${BUILD}/cni-plugins"
  log "cni: fetching github.com/containernetworking/plugins@${CNI_PLUGINS_VERSION}"
  new_module "${CDIR}" cni-plugins github.com/containernetworking/plugins "${CNI_PLUGINS_VERSION}"
  pkgs=()
  for p in "${CNI_PLUGINS[@]}"; do pkgs+=("github.com/containernetworking/plugins/plugins/${p}@${CNI_PLUGINS_VERSION}"); done
  timed cni-go-get gorun "${CDIR}" get "${pkgs[@]}" || die "go get for the CNI plugins failed"
  # As upstream's build script: the version the plugins print for VERSION requests.
  CLDFLAGS="-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=${CNI_PLUGINS_VERSION}"
  for p in "${CNI_PLUGINS[@]}"; do
    build_one "cni/${p#*/}" "${CDIR}" "github.com/containernetworking/plugins/plugins/${p}" "${CLDFLAGS}"
  done
else
  for p in "${CNI_PLUGINS[@]}"; do log "cached: ${BIN}/cni/${p#*/}"; TIMES[cni/${p#*/}]=cached; done
fi

# --- containerd -------------------------------------------------------------------
if need_any containerd containerd-shim-runc-v2 ctr; then
  DDIR="${BUILD}/containerd"
  log "containerd: fetching github.com/containerd/containerd/v2@${CONTAINERD_VERSION}"
  new_module "${DDIR}" containerd github.com/containerd/containerd/v2 "${CONTAINERD_VERSION}"
  timed containerd-go-get gorun "${DDIR}" get \
    "github.com/containerd/containerd/v2/cmd/containerd@${CONTAINERD_VERSION}" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@${CONTAINERD_VERSION}" \
    "github.com/containerd/containerd/v2/cmd/ctr@${CONTAINERD_VERSION}" \
    || die "go get for containerd failed"
  DPKG=github.com/containerd/containerd/v2
  DLDFLAGS="-X ${DPKG}/version.Version=${CONTAINERD_VERSION} -X ${DPKG}/version.Package=${DPKG}"
  # CGO_ENABLED=0 already leaves out the btrfs snapshotter (its files need cgo); the tags drop the
  # other snapshotters the bed does not use, as upstream's static builds do (no_grpc only for the shim).
  DTAGS="no_btrfs,no_devmapper,no_zfs,urfave_cli_no_docs,osusergo,netgo,static_build"
  build_one containerd              "${DDIR}" "${DPKG}/cmd/containerd"              "${DLDFLAGS}" "${DTAGS}"
  build_one containerd-shim-runc-v2 "${DDIR}" "${DPKG}/cmd/containerd-shim-runc-v2" "${DLDFLAGS}" "${DTAGS},no_grpc"
  build_one ctr                     "${DDIR}" "${DPKG}/cmd/ctr"                     "${DLDFLAGS}" "${DTAGS}"
else
  for b in containerd containerd-shim-runc-v2 ctr; do log "cached: ${BIN}/${b}"; TIMES[${b}]=cached; done
fi

# --- kubernetes: kubelet, kube-proxy (kube-controller-manager: build-control-plane.sh) ---
K8S_TOOLS=(kubelet kube-proxy)  # kube-controller-manager comes with build-control-plane.sh
if need_any "${K8S_TOOLS[@]}"; then
  KDIR="${BUILD}/kubernetes"
  mkdir -p "${KDIR}"
  log "kubernetes: fetching k8s.io/kubernetes@${KUBERNETES_VERSION}"
  KMOD=$(mod_download_field k8s.io/kubernetes "${KUBERNETES_VERSION}" GoMod)
  [[ -f "${KMOD}" ]] || die "no go.mod for k8s.io/kubernetes@${KUBERNETES_VERSION}"
  # As in build-control-plane.sh: every ./staging replace becomes the published k8s.io/X v0.N.M.
  mapfile -t STAGING < <(sed -nE 's#^[[:space:]]*(replace[[:space:]]+)?(k8s\.io/[^[:space:]]+)[[:space:]]+=>[[:space:]]+\./staging/.*#\2#p' "${KMOD}" | sort -u)
  (( ${#STAGING[@]} > 0 )) || die "found no staging replaces in ${KMOD}"
  {
    echo "// Generated by tests/e2e/build-node.sh; do not edit."
    echo "module gpu-webhook.invalid/node/kubernetes"
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
  kpkgs=()
  for t in "${K8S_TOOLS[@]}"; do kpkgs+=("k8s.io/kubernetes/cmd/${t}@${KUBERNETES_VERSION}"); done
  timed kubernetes-go-get gorun "${KDIR}" get "${kpkgs[@]}" || die "go get for kubernetes failed"
  KDATE=$(module_time k8s.io/kubernetes "${KUBERNETES_VERSION}")
  KLDFLAGS=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    KLDFLAGS+=" -X ${p}.gitVersion=${KUBERNETES_VERSION} -X ${p}.gitMajor=1 -X ${p}.gitMinor=${K8S_MINOR}"
    KLDFLAGS+=" -X ${p}.gitTreeState=clean -X ${p}.buildDate=${KDATE:-1970-01-01T00:00:00Z} -X ${p}.gitCommit="
  done
  KTAGS="selinux,notest,grpcnotrace"
  for t in "${K8S_TOOLS[@]}"; do
    build_one "${t}" "${KDIR}" "k8s.io/kubernetes/cmd/${t}" "${KLDFLAGS}" "${KTAGS}"
  done
else
  for t in "${K8S_TOOLS[@]}"; do log "cached: ${BIN}/${t}"; TIMES[${t}]=cached; done
fi

# --- summary ----------------------------------------------------------------------
cat > "${TOP}/versions.txt" <<EOF
KUBERNETES_VERSION=${KUBERNETES_VERSION}
CONTAINERD_VERSION=${CONTAINERD_VERSION}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION}
RUNC=$(runc --version 2>/dev/null | head -n1)
EOF
for b in "${K8S_TOOLS[@]}" containerd containerd-shim-runc-v2 ctr cni/bridge cni/host-local cni/loopback; do
  [[ -x "${BIN}/${b}" ]] || die "missing ${BIN}/${b} after build"
done
for name in "${IMAGE_REFS[@]}"; do [[ -f "${IMAGES}/${name}.oci.tar" ]] || die "missing ${IMAGES}/${name}.oci.tar"; done
for k in $(printf '%s\n' "${!TIMES[@]}" | sort); do log "  ${k}: ${TIMES[${k}]}"; done
log "done in $(( $(date +%s) - T0 ))s"
echo "${BIN}"
