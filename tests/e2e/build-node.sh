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
# Environment knobs (GPU_WEBHOOK_CACHE, GPU_WEBHOOK_BUILD_JOBS, GPU_WEBHOOK_BUILD_TIMEOUT, GO): see go-build.sh,
# the helpers this script shares with build-control-plane.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=build-node.sh
IMAGES_SRC="${HERE}/images"
# shellcheck source=tests/e2e/go-build.sh
source "${HERE}/go-build.sh"

read_versions
: "${CONTAINERD_VERSION:?set in versions.env}" "${CNI_PLUGINS_VERSION:?set in versions.env}"
[[ "${CONTAINERD_VERSION}" =~ ^v2\. ]] || die "CONTAINERD_VERSION must be a v2.x tag, got ${CONTAINERD_VERSION}"

KEY="${KUBERNETES_VERSION}-${CONTAINERD_VERSION}-${CNI_PLUGINS_VERSION}"
TOP="${CACHE_ROOT}/node/${KEY}"
BIN="${TOP}/bin"
BUILD="${TOP}/build"
find_go

# The images' cache key: a hash of their sources (tests/e2e/node.py computes the same one).
IMAGES_HASH=$(cd "${IMAGES_SRC}" \
  && find . -type f \( -name '*.go' -o -name go.mod -o -name '*.py' \) -not -path '*/__pycache__/*' \
     | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
IMAGES="${CACHE_ROOT}/node/images/${IMAGES_HASH}"

if [[ "${1:-}" == --print-images-dir ]]; then  # where the images go, without building (tests compare it)
  echo "${IMAGES}"
  exit 0
fi

cache_dir "${CACHE_ROOT}/node/.lock" "${BIN}/cni" "${BUILD}" "${IMAGES}"

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
  new_module "${CDIR}" node/cni-plugins github.com/containernetworking/plugins "${CNI_PLUGINS_VERSION}"
  pkgs=()
  for p in "${CNI_PLUGINS[@]}"; do pkgs+=("github.com/containernetworking/plugins/plugins/${p}@${CNI_PLUGINS_VERSION}"); done
  timed cni-go-get gorun "${CDIR}" get "${pkgs[@]}" || die "go get for the CNI plugins failed"
  # As upstream's build script: the version the plugins print for VERSION requests.
  CLDFLAGS="-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=${CNI_PLUGINS_VERSION}"
  for p in "${CNI_PLUGINS[@]}"; do
    build_one "cni/${p#*/}" "${CDIR}" "github.com/containernetworking/plugins/plugins/${p}" "${CLDFLAGS}"
  done
else
  all_cached cni/bridge cni/host-local cni/loopback
fi

# --- containerd -------------------------------------------------------------------
if need_any containerd containerd-shim-runc-v2 ctr; then
  DDIR="${BUILD}/containerd"
  log "containerd: fetching github.com/containerd/containerd/v2@${CONTAINERD_VERSION}"
  new_module "${DDIR}" node/containerd github.com/containerd/containerd/v2 "${CONTAINERD_VERSION}"
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
  all_cached containerd containerd-shim-runc-v2 ctr
fi

# --- kubernetes: kubelet, kube-proxy (kube-controller-manager: build-control-plane.sh) ---
K8S_TOOLS=(kubelet kube-proxy)  # kube-controller-manager comes with build-control-plane.sh
if need_any "${K8S_TOOLS[@]}"; then
  KDIR="${BUILD}/kubernetes"
  log "kubernetes: fetching k8s.io/kubernetes@${KUBERNETES_VERSION}"
  kubernetes_module "${KDIR}" node/kubernetes
  kpkgs=()
  for t in "${K8S_TOOLS[@]}"; do kpkgs+=("k8s.io/kubernetes/cmd/${t}@${KUBERNETES_VERSION}"); done
  timed kubernetes-go-get gorun "${KDIR}" get "${kpkgs[@]}" || die "go get for kubernetes failed"
  KLDFLAGS=$(kubernetes_ldflags)
  for t in "${K8S_TOOLS[@]}"; do
    build_one "${t}" "${KDIR}" "k8s.io/kubernetes/cmd/${t}" "${KLDFLAGS}" "${KUBERNETES_TAGS}"
  done
else
  all_cached "${K8S_TOOLS[@]}"
fi

# --- summary ----------------------------------------------------------------------
cat > "${TOP}/versions.txt" <<EOF
KUBERNETES_VERSION=${KUBERNETES_VERSION}
CONTAINERD_VERSION=${CONTAINERD_VERSION}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION}
RUNC=$(runc --version 2>/dev/null | head -n1)
EOF
for name in "${IMAGE_REFS[@]}"; do [[ -f "${IMAGES}/${name}.oci.tar" ]] || die "missing ${IMAGES}/${name}.oci.tar"; done
finish "${K8S_TOOLS[@]}" containerd containerd-shim-runc-v2 ctr cni/bridge cni/host-local cni/loopback
