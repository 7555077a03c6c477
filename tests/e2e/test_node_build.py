"""What ties build-node.sh to the node bed without starting one: both find the images at the same place, and the
OCI archives we package are well-formed and reproducible."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile

from tests.e2e import node
from tests.e2e.images import ociarchive


def test_build_script_and_bed_agree_on_the_images_directory():
    printed = subprocess.run(["bash", str(node.HERE / "build-node.sh"), "--print-images-dir"], check=True,
                             capture_output=True, text=True, timeout=60).stdout.strip()
    assert printed == str(node.images_dir())


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_oci_archive_is_a_reproducible_single_layer_image_layout():
    files = {"/pause": b"\x7fELF not really"}
    first = ociarchive.archive("gw-e2e.invalid/pause:1", files, ["/pause"])
    assert first == ociarchive.archive("gw-e2e.invalid/pause:1", files, ["/pause"])
    members = _members(first)
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(members["index.json"])["manifests"]
    assert entry["annotations"] == {"io.containerd.image.name": "gw-e2e.invalid/pause:1",
                                    "org.opencontainers.image.ref.name": "1"}

    def blob(descriptor: dict) -> bytes:
        data = members["blobs/sha256/" + descriptor["digest"].removeprefix("sha256:")]
        assert "sha256:" + hashlib.sha256(data).hexdigest() == descriptor["digest"]
        assert len(data) == descriptor["size"]
        return data

    manifest = json.loads(blob(entry))
    config = json.loads(blob(manifest["config"]))
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == ociarchive.LAYER_TYPE
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]  # uncompressed: the digest is the diff ID
    assert config["config"]["Entrypoint"] == ["/pause"] and config["config"]["User"] == "65532:65532"
    contents = _members(blob(layer))
    assert contents == {"pause": files["/pause"]}
    with tarfile.open(fileobj=io.BytesIO(blob(layer))) as tar:
        assert tar.getmember("pause").mode == 0o755 and tar.getmember("pause").mtime == 0
