"""Package static binaries as a single-layer OCI image archive (an OCI image layout in a tar) that
``ctr images import`` reads, without any container tool or registry.

    python3 tests/e2e/images/ociarchive.py --ref gw-e2e.invalid/pause:1 --out pause.oci.tar \
        --entrypoint /pause /path/to/pause=/pause

The layer is an uncompressed tar (media type ``application/vnd.oci.image.layer.v1.tar``), so its digest is
also its diff ID. Every timestamp is zero and entries are sorted, so the same inputs give the same bytes.
The reference goes in the index as ``io.containerd.image.name`` (what containerd names the image) and its
tag as ``org.opencontainers.image.ref.name``. Standard library only: build-node.sh runs it with python3.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import tarfile
from pathlib import Path

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _entry(name: str, size: int = 0, mode: int = 0o755, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type, info.mtime = size, mode, kind, 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def layer(files: dict[str, bytes]) -> bytes:
    """A tar of ``files`` (absolute path in the image -> content, all executable) and their parent dirs."""
    dirs = sorted({str(Path(p).parent).lstrip("/") for p in files} - {""})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in dirs:
            tar.addfile(_entry(directory + "/", kind=tarfile.DIRTYPE))
        for path in sorted(files):
            data = files[path]
            tar.addfile(_entry(path.lstrip("/"), size=len(data)), io.BytesIO(data))
    return buffer.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def archive(ref: str, files: dict[str, bytes], entrypoint: list[str], user: str = "65532:65532",
            arch: str | None = None) -> bytes:
    """The bytes of an OCI archive holding one image named ``ref`` (``name:tag``)."""
    arch = arch or GOARCH.get(platform.machine(), platform.machine())
    layer_digest, layer_data = _blob(layer(files))
    config_digest, config_data = _blob(_json({
        "architecture": arch,
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "User": user, "WorkingDir": "/",
                   "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "tests/e2e/images/ociarchive.py"}],
    }))
    manifest_digest, manifest_data = _blob(_json({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": len(config_data)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": len(layer_data)}],
    }))
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    index = _json({
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_TYPE, "digest": manifest_digest, "size": len(manifest_data),
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag},
        }],
    })
    members = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": index,
        **{f"blobs/sha256/{d.split(':', 1)[1]}": data for d, data in
           ((layer_digest, layer_data), (config_digest, config_data), (manifest_digest, manifest_data))},
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs/", "blobs/sha256/"):
            tar.addfile(_entry(directory, kind=tarfile.DIRTYPE))
        for name in sorted(members):
            tar.addfile(_entry(name, size=len(members[name]), mode=0o644), io.BytesIO(members[name]))
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="image name:tag, e.g. gw-e2e.invalid/pause:1")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--entrypoint", required=True, action="append", help="repeat for each argument")
    parser.add_argument("--user", default="65532:65532")
    parser.add_argument("files", nargs="+", help="SOURCE=/path/in/image")
    args = parser.parse_args(argv)
    files = {}
    for spec in args.files:
        source, _, target = spec.partition("=")
        if not target.startswith("/"):
            parser.error(f"{spec}: expected SOURCE=/absolute/path/in/image")
        files[target] = Path(source).read_bytes()
    data = archive(args.ref, files, args.entrypoint, user=args.user)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(args.out)
    print(f"{args.out}: {args.ref}, {len(data)} bytes")


if __name__ == "__main__":
    main()
