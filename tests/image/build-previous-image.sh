#!/usr/bin/env bash
# Build the image of the previous release (the commit tests/e2e/test_node_upgrade.py upgrades from) with that
# commit's own tests/image/build-image.sh, in a temporary `git worktree` of it, removed afterwards.
#
#   tests/image/build-previous-image.sh                  # stdout's last line is the archive
#   tests/image/build-previous-image.sh --print-archive  # only print its path (no build)
#
# The archive lands where that commit's build-image.sh puts it: ${GPU_WEBHOOK_CACHE}/image/archive/<key>/, <key>
# hashing that tree's inputs, so it never overwrites this tree's archive. Inside it the image is named as that
# tree names it (localhost/gpu-webhook:<its version>), which may be the name this tree's image has too: the test
# retags it in the node's containerd (see test_node_upgrade.py) so the two stay apart.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "${HERE}/../.." && pwd)
COMMIT=$(sed -nE 's/^PREVIOUS_COMMIT = "([0-9a-f]+)".*/\1/p' "${ROOT}/tests/e2e/test_node_upgrade.py")
[[ -n "${COMMIT}" ]] || { echo "build-previous-image: no PREVIOUS_COMMIT in tests/e2e/test_node_upgrade.py" >&2; exit 1; }
TREE=$(mktemp -d "${TMPDIR:-/tmp}/gw-previous-XXXXXX")
cleanup() { git -C "${ROOT}" worktree remove --force "${TREE}/tree" >/dev/null 2>&1 || true; rm -rf "${TREE}"; }
trap cleanup EXIT
git -C "${ROOT}" worktree add --detach "${TREE}/tree" "${COMMIT}" >&2
bash "${TREE}/tree/tests/image/build-image.sh" "$@"
