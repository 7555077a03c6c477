#!/usr/bin/env bash
# Build celeval (tests/celeval/main.go): the generated admission policies compiled and evaluated by
# k8s.io/apiserver's own admission CEL packages, for the unit tier. Cached by the hash of its sources:
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/celeval/<hash>/celeval   (the path is the only stdout)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE="${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}"
KEY=$(cat "${HERE}/go.mod" "${HERE}/go.sum" "${HERE}/main.go" | sha256sum | cut -c1-16)
OUT="${CACHE}/celeval/${KEY}"
if [[ -x "${OUT}/celeval" ]]; then
  echo "celeval: cached ${OUT}/celeval" >&2
  echo "${OUT}/celeval"
  exit 0
fi
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "${GO}" ]] || { echo "celeval: the Go toolchain (go) is needed" >&2; exit 1; }
mkdir -p "${OUT}"
start=$(date +%s)
# -mod=readonly: go.mod and go.sum are committed; a build never rewrites them.
(cd "${HERE}" && GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 \
  timeout "${GPU_WEBHOOK_BUILD_TIMEOUT:-1800}" "${GO}" build -p "${GPU_WEBHOOK_BUILD_JOBS:-2}" -o "${OUT}/celeval.tmp" .)
mv "${OUT}/celeval.tmp" "${OUT}/celeval"
echo "celeval: built ${OUT}/celeval in $(( $(date +%s) - start ))s" >&2
echo "${OUT}/celeval"
