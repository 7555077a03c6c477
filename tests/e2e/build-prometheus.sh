#!/usr/bin/env bash
# Build promtool and the Prometheus server from the Go module proxy into a cache directory, the way
# build-control-plane.sh builds the control plane:
#
#   promtool    github.com/prometheus/prometheus/cmd/promtool (PROMETHEUS_VERSION; v0.X.Y is Prometheus 3.X.Y)
#   prometheus  github.com/prometheus/prometheus/cmd/prometheus: the same module, version, tags and version stamp
#
# promtool checks and unit-tests the chart's alert rules and parses the dashboard's queries (tests/test_monitoring.py);
# the server scrapes the webhook and the apiserver on the node bed, evaluates the alerts and answers the dashboard's
# queries there (tests/e2e/test_node_alerts.py). Both are built with the tag remove_all_sd, which leaves out the cloud
# service discoveries (AWS, Azure, GCE, Kubernetes, ...): the tests use none, and they are much of the download and
# the compile; the file and HTTP discoveries stay (the node-bed test writes the webhook pods into a file), and
# promtool keeps the Kubernetes one it imports itself. Without the tag builtinassets the server serves no web UI:
# the tests use its HTTP API only.
#
# Times on this project's 2-core machine, other builds and tests running beside it: promtool 197 s after the
# control-plane step (Go's module and build caches shared with it), 648 s with both caches empty (load average about
# 11; 2026-12-05). The server, built after promtool: 172 s more (2026-12-05, Go's module cache warm, the build cache
# holding promtool's packages only, load average about 8), plus its own modules in the `go get` (21 s for both
# commands with the module cache warm). A cold step should then take about 14 minutes (not measured).
#
#   tests/e2e/build-prometheus.sh          # build what is missing; stdout is only the bin dir
#
# Output: ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/prometheus/<version>/bin/{promtool,prometheus}
# Environment knobs (GPU_WEBHOOK_CACHE, GPU_WEBHOOK_BUILD_JOBS, GPU_WEBHOOK_BUILD_TIMEOUT, GO): see go-build.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=build-prometheus.sh
# shellcheck source=tests/e2e/go-build.sh
source "${HERE}/go-build.sh"

read_versions
: "${PROMETHEUS_VERSION:?set in versions.env}"
MODULE=github.com/prometheus/prometheus
TOP="${CACHE_ROOT}/prometheus/${PROMETHEUS_VERSION}"
BIN="${TOP}/bin"
BUILD="${TOP}/build"
find_go
cache_dir "${TOP}/.lock" "${BIN}" "${BUILD}"

T0=$(date +%s)
log "prometheus ${PROMETHEUS_VERSION} -> ${BIN} ($("${GO}" version), jobs=${JOBS})"

if need_any promtool prometheus; then
  PDIR="${BUILD}/prometheus"
  # The module has no replace directives to repeat.
  new_module "${PDIR}" prometheus "${MODULE}" "${PROMETHEUS_VERSION}"
  log "prometheus: resolving dependencies (go get)"
  timed prometheus-go-get gorun "${PDIR}" get "${MODULE}/cmd/promtool@${PROMETHEUS_VERSION}" \
    "${MODULE}/cmd/prometheus@${PROMETHEUS_VERSION}" || die "go get for promtool and prometheus failed"
  # The version stamp of upstream's release build (.promu.yml): `promtool --version` says which release it is.
  SRC=$(mod_download_field "${MODULE}" "${PROMETHEUS_VERSION}" Dir)
  RELEASE=$(tr -d '[:space:]' < "${SRC}/VERSION")
  PDATE=$(module_time "${MODULE}" "${PROMETHEUS_VERSION}")
  V=github.com/prometheus/common/version
  PLDFLAGS="-X ${V}.Version=${RELEASE} -X ${V}.Revision=${PROMETHEUS_VERSION} -X ${V}.Branch=HEAD"
  PLDFLAGS+=" -X ${V}.BuildUser=gpu-webhook-tests -X ${V}.BuildDate=${PDATE:-1970-01-01T00:00:00Z}"
  build_one promtool "${PDIR}" "${MODULE}/cmd/promtool" "${PLDFLAGS}" remove_all_sd
  # Built second: most of its packages are promtool's, already compiled.
  build_one prometheus "${PDIR}" "${MODULE}/cmd/prometheus" "${PLDFLAGS}" remove_all_sd
else
  all_cached promtool prometheus
fi

echo "PROMETHEUS_VERSION=${PROMETHEUS_VERSION}" > "${TOP}/versions.txt"
finish promtool prometheus
