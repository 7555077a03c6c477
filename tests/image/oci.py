"""Read an OCI image archive (as `buildah push … oci-archive:` writes it) and run it with runc or crun.

No image store is involved: the layers are read with tarfile, whiteouts applied, and the unpacked root
filesystem is run by runc (or crun) from a runtime config made here (read-only root, /tmp from the host, the image's
user, no capabilities, the host's network so a loopback port is reachable).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


@dataclass
class Entry:
    """One path of the image's final filesystem."""

    path: str  # absolute, e.g. /usr/bin/python3
    mode: int
    uid: int
    gid: int
    size: int
    linkname: str = ""

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def executable(self) -> bool:
        return (stat.S_ISREG(self.mode) or stat.S_ISLNK(self.mode)) and bool(self.mode & 0o111)


@dataclass
class Image:
    archive: Path
    index: dict
    manifest: dict
    config: dict
    layers: list[dict] = field(default_factory=list)

    @property
    def runtime(self) -> dict:
        """The image's runtime configuration (User, Entrypoint, Cmd, Env, WorkingDir)."""
        return self.config.get("config") or {}

    @property
    def ref_name(self) -> str:
        return self.index["manifests"][0].get("annotations", {}).get("org.opencontainers.image.ref.name", "")


def _blob(tar: tarfile.TarFile, descriptor: dict) -> IO[bytes]:
    algorithm, digest = descriptor["digest"].split(":", 1)
    member = tar.extractfile(f"blobs/{algorithm}/{digest}")
    if member is None:
        raise ValueError(f"blob {descriptor['digest']} is not a file")
    return member


def read(archive: Path) -> Image:
    with tarfile.open(archive) as tar:
        index_file = tar.extractfile("index.json")
        assert index_file is not None
        index = json.load(index_file)
        if len(index["manifests"]) != 1:
            raise ValueError(f"expected one manifest in index.json, found {len(index['manifests'])}")
        manifest = json.load(_blob(tar, index["manifests"][0]))
        config = json.load(_blob(tar, manifest["config"]))
    return Image(archive, index, manifest, config, manifest["layers"])


def _layer_stream(tar: tarfile.TarFile, layer: dict) -> IO[bytes]:
    stream: IO[bytes] = _blob(tar, layer)
    media_type = layer["mediaType"]
    if media_type.endswith("+gzip") or media_type.endswith(".gzip"):
        return gzip.GzipFile(fileobj=stream)  # type: ignore[return-value]
    if media_type.endswith("+zstd") or media_type.endswith(".zstd"):
        raise ValueError(f"zstd layers are not supported here: {media_type}")
    return stream


def _members(image: Image):
    """(layer number, TarInfo, layer TarFile) for every member of every layer, bottom layer first."""
    with tarfile.open(image.archive) as outer:
        for number, layer in enumerate(image.layers):
            with tarfile.open(fileobj=_layer_stream(outer, layer), mode="r|") as inner:
                for member in inner:
                    yield number, member, inner


def _norm(name: str) -> str:
    return str(PurePosixPath("/") / PurePosixPath(name.lstrip("./") or "."))


def files(image: Image) -> dict[str, Entry]:
    """The final filesystem: every layer applied in order, whiteouts included."""
    tree: dict[str, Entry] = {}

    def drop_below(directory: str) -> None:
        prefix = directory.rstrip("/") + "/"
        for key in [k for k in tree if k.startswith(prefix)]:
            del tree[key]

    for _, member, _ in _members(image):
        path = _norm(member.name)
        parent, base = os.path.split(path)
        if base == OPAQUE:
            drop_below(parent)
            continue
        if base.startswith(WHITEOUT):
            gone = os.path.join(parent, base[len(WHITEOUT):])
            if gone in tree:
                if tree.pop(gone).is_dir:
                    drop_below(gone)
            continue
        if member.isdir():
            mode = stat.S_IFDIR
        elif member.issym():
            mode = stat.S_IFLNK
        elif member.isfile() or member.islnk():
            mode = stat.S_IFREG
        else:
            mode = 0  # device nodes and fifos
        old = tree.get(path)
        if old is not None and old.is_dir and not member.isdir():  # a file replacing a directory
            drop_below(path)
        tree[path] = Entry(path, member.mode | mode, member.uid, member.gid, member.size, member.linkname)
    return tree


def unpack(image: Image, rootfs: Path) -> None:
    """Extract the layers into ``rootfs`` (as root: ownership and modes kept), whiteouts applied."""
    rootfs.mkdir(parents=True, exist_ok=True)
    for _, member, inner in _members(image):
        path = _norm(member.name)
        parent, base = os.path.split(path)
        target = rootfs / path.lstrip("/")
        if base == OPAQUE:
            directory = rootfs / parent.lstrip("/")
            for child in directory.iterdir() if directory.is_dir() else ():
                _remove(child)
            continue
        if base.startswith(WHITEOUT):
            _remove(target.parent / base[len(WHITEOUT):])
            continue
        if member.ischr() or member.isblk() or member.isfifo():
            continue  # device nodes come from the runtime
        if not member.isdir() and (target.exists() or target.is_symlink()):
            _remove(target)
        # The "tar" filter refuses absolute paths and links that leave rootfs; it clears set-id bits,
        # which the smoke tests (one non-root user) never need.
        inner.extract(member, rootfs, numeric_owner=True, filter="tar")


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def runtime_config(image: Image, rootfs: Path, tmp: Path, args: list[str] | None = None,
                   entrypoint: list[str] | None = None, cwd: str | None = None) -> dict:
    """A runtime config like a kubelet's for the chart's securityContext: read-only root, /tmp writable,
    the image's numeric user, no capabilities, no new privileges; the host's network namespace."""
    runtime = image.runtime
    user = runtime.get("User", "0")
    uid, _, gid = user.partition(":")
    if entrypoint is None:
        entrypoint = list(runtime.get("Entrypoint") or [])
    process_args = entrypoint + list(args if args is not None else runtime.get("Cmd") or [])
    no_caps: dict[str, list[str]] = {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": int(uid), "gid": int(gid or uid)},
            "args": process_args,
            "env": list(runtime.get("Env") or []),
            "cwd": cwd or runtime.get("WorkingDir") or "/",
            "capabilities": no_caps,
            "noNewPrivileges": True,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
        },
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "gpu-webhook",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "bind", "source": str(tmp), "options": ["rbind", "rw", "nosuid", "nodev"]},
        ],
        "linux": {
            # No network namespace: the server's loopback port is the host's.
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def runtime_command(bundle: Path, state_root: Path, name: str) -> list[str]:
    """runc when installed, else crun. crun refuses hosts with hybrid cgroups (v1 controllers plus
    controllers in the v2 hierarchy), even with its cgroup manager disabled; runc runs there."""
    if shutil.which("runc"):
        return ["runc", "--root", str(state_root), "run", "--bundle", str(bundle), name]
    return ["crun", "--root", str(state_root), "--cgroup-manager=disabled", "run", "--bundle", str(bundle), name]


def prepare_bundle(image: Image, rootfs: Path, bundle: Path, args: list[str] | None = None,
                   binds: dict[str, Path] | None = None, entrypoint: list[str] | None = None,
                   cwd: str | None = None, writable: Collection[str] = ()) -> Path:
    """Write bundle/config.json for ``args`` (default: the image's Cmd) with ``binds`` (container path:
    host path) mounted read-only, or read-write for the container paths in ``writable``, ``cwd`` the working
    directory (default: the image's), and a fresh /tmp owned by the image's user; returns that /tmp's host
    directory."""
    bundle.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(bundle) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    config = runtime_config(image, rootfs, tmp, args, entrypoint, cwd)
    for destination, source in (binds or {}).items():
        mode = "rw" if destination in writable else "ro"
        config["mounts"].append({"destination": destination, "type": "bind", "source": str(source),
                                 "options": ["rbind", mode, "nosuid", "nodev"]})
    user = config["process"]["user"]
    os.chown(tmp, user["uid"], user["gid"])
    tmp.chmod(0o700)
    (bundle / "config.json").write_text(json.dumps(config, indent=2))
    return tmp


def run(image: Image, rootfs: Path, bundle: Path, state_root: Path, name: str, args: list[str],
        binds: dict[str, Path] | None = None, entrypoint: list[str] | None = None,
        timeout: float = 60, cwd: str | None = None, writable: Collection[str] = ()) -> subprocess.CompletedProcess:
    """Run the image's entrypoint (or ``entrypoint``) with ``args`` to completion (``binds``, ``cwd`` and
    ``writable`` as for prepare_bundle)."""
    prepare_bundle(image, rootfs, bundle, args, binds, entrypoint, cwd, writable)
    try:
        return subprocess.run(runtime_command(bundle, state_root, name), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    finally:
        delete(state_root, name)


def start(image: Image, rootfs: Path, bundle: Path, state_root: Path, name: str, args: list[str],
          log: Path) -> tuple[subprocess.Popen, Path]:
    """Start the image's entrypoint with ``args`` in the background (output to ``log``); returns the
    process and the host directory of the container's /tmp."""
    tmp = prepare_bundle(image, rootfs, bundle, args)
    with log.open("wb") as out:
        proc = subprocess.Popen(runtime_command(bundle, state_root, name), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return proc, tmp


def stop(proc: subprocess.Popen, state_root: Path, name: str, timeout: float = 30) -> int:
    """SIGTERM the container (as the kubelet does), then kill it if it outlives ``timeout``."""
    tool = "runc" if shutil.which("runc") else "crun"
    subprocess.run([tool, "--root", str(state_root), "kill", name, "TERM"], capture_output=True, timeout=30)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        subprocess.run([tool, "--root", str(state_root), "kill", name, "KILL"], capture_output=True, timeout=30)
        code = proc.wait(timeout=30)
    delete(state_root, name)
    return code


def delete(state_root: Path, name: str) -> None:
    tool = "runc" if shutil.which("runc") else "crun"
    subprocess.run([tool, "--root", str(state_root), "delete", "--force", name], capture_output=True, timeout=30)
