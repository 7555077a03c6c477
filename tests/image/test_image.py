"""The webhook image, as `tests/prepare image` (tests/image/build-image.sh) built it for this tree.

Nothing is built here: the tests read the OCI archive the build script wrote (its path comes from
`build-image.sh --print-archive`, a hash of the image's inputs), check its config and its files, then run it
with runc (or crun) on the unpacked root filesystem, read-only, as the image's user, as the Helm chart runs it.
Without the archive the module skips locally and fails in CI (``CI=true``).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import stat
import subprocess
import time
from pathlib import Path

import pytest

import webhook
from tests import recipes
from tests.image import oci
from tests.tools import ROOT, unavailable

BUILD_IMAGE = ROOT / "tests" / "image" / "build-image.sh"
USER = "65532:65532"
BIN_DIRS = ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/opt/gpu-webhook/bin")
# The unpacked image is 365 MB on the Debian bookworm test base (the public Python slim base is smaller).
MAX_UNPACKED_BYTES = 450_000_000


@pytest.fixture(scope="module")
def archive() -> Path:
    path = Path(subprocess.run([str(BUILD_IMAGE), "--print-archive"], check=True, capture_output=True,
                               text=True, timeout=60).stdout.strip())
    if not path.is_file():
        unavailable("webhook image", f"no OCI archive for this tree at {path}", "image")
    return path


@pytest.fixture(scope="module")
def image(archive) -> oci.Image:
    return oci.read(archive)


@pytest.fixture(scope="module")
def tree(image) -> dict[str, oci.Entry]:
    return oci.files(image)


def _runnable() -> str | None:
    if os.geteuid() != 0:
        return "running the image needs root (runc/crun as root, ownership kept when unpacking)"
    if not (shutil.which("runc") or shutil.which("crun")):
        return "no OCI runtime: apt-get install runc"
    return None


@pytest.fixture(scope="module")
def rootfs(image, tmp_path_factory):
    reason = _runnable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"image smoke tests: {reason}", pytrace=False)
        pytest.skip(f"image smoke tests: {reason}")
    work = tmp_path_factory.mktemp("image")
    oci.unpack(image, work / "rootfs")
    yield work
    shutil.rmtree(work, ignore_errors=True)  # about 365 MB: not left for pytest's basetemp rotation


# --- the archive and its config ---------------------------------------------------------------


def test_archive_is_an_oci_image_layout_that_containerd_can_import(archive, image):
    names = subprocess.run(["tar", "-tf", str(archive)], check=True, capture_output=True, text=True,
                           timeout=60).stdout.split()
    assert "oci-layout" in names and "index.json" in names
    assert image.index["manifests"][0]["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    # `ctr images import` names the image after this annotation when it is a full reference.
    assert image.ref_name == f"localhost/gpu-webhook:{webhook.__version__}"
    assert image.config["os"] == "linux" and image.config["architecture"] == "amd64"
    assert image.layers and all(layer["mediaType"].startswith("application/vnd.oci.image.layer.v1.tar")
                                for layer in image.layers)
    # The key in the archive's path is the one its image was labelled with when built.
    assert image.runtime["Labels"]["io.gpu-webhook.image.key"] == archive.parent.name


def test_skopeo_reads_the_archive(archive, image):
    if not shutil.which("skopeo"):
        pytest.skip("skopeo not installed (apt-get install skopeo)")
    raw = subprocess.run(["skopeo", "inspect", "--raw", f"oci-archive:{archive}"], check=True,
                         capture_output=True, timeout=120).stdout
    assert json.loads(raw) == image.manifest
    config = json.loads(subprocess.run(["skopeo", "inspect", "--config", f"oci-archive:{archive}"], check=True,
                                       capture_output=True, timeout=120).stdout)
    assert config["config"]["User"] == USER


def test_config_runs_gpu_webhook_as_a_numeric_non_root_user(image):
    runtime = image.runtime
    assert runtime["User"] == USER  # numeric: runAsNonRoot can check it without /etc/passwd
    assert runtime["Entrypoint"] == ["gpu-webhook"]
    # All interfaces: `docker run -p 8443:8443` forwards to the container's interface, never its loopback.
    assert runtime["Cmd"] == ["serve", "--self-signed", "--host", "0.0.0.0"]
    assert "8443/tcp" in runtime["ExposedPorts"]
    env = dict(item.split("=", 1) for item in runtime["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PATH"].split(":")[0] == "/opt/gpu-webhook/bin"


# --- the files ----------------------------------------------------------------------------------

PACKAGING = re.compile(
    r"/(site|dist)-packages/(pip|setuptools|wheel|pkg_resources|_distutils_hack)(/|-[^/]*\.dist-info|$)"
    r"|/python3[^/]*/ensurepip(/|$)"
    r"|\.whl$"
)
PACKAGING_TOOLS = re.compile(r"(pip|pip3(\.\d+)?|easy_install(-[\d.]+)?|wheel)")
COMPILERS = re.compile(
    r"((x86_64|aarch64)-linux-gnu-)?(cc|c\+\+|c89|c99|gcc|g\+\+|cpp|clang|clang\+\+|tcc|ld|ld\.bfd|ld\.gold|as)"
    r"(-\d+(\.\d+)*)?"
)


def _executables(tree: dict[str, oci.Entry]) -> dict[str, oci.Entry]:
    return {path: entry for path, entry in tree.items()
            if os.path.dirname(path) in BIN_DIRS and not entry.is_dir}


def test_no_pip_setuptools_wheel_or_ensurepip(tree):
    assert [path for path in tree if PACKAGING.search(path)] == []
    tools = [path for path in _executables(tree) if PACKAGING_TOOLS.fullmatch(os.path.basename(path))]
    assert tools == []


def test_no_compiler(tree):
    compilers = [path for path in _executables(tree) if COMPILERS.fullmatch(os.path.basename(path))]
    assert compilers == []
    assert [path for path in tree if re.search(r"/gcc/[^/]+/[^/]+/cc1(plus)?$", path)] == []


def _resolve(tree: dict[str, oci.Entry], path: str) -> str:
    """Follow symlinks inside the image (at most 10)."""
    for _ in range(10):
        entry = tree.get(path)
        if entry is None or not stat.S_ISLNK(entry.mode):
            return path
        path = os.path.normpath(os.path.join(os.path.dirname(path), entry.linkname))
    raise AssertionError(f"symlink loop at {path}")


def test_the_venv_uses_the_base_images_interpreter(tree):
    # Both stages are FROM the same base, so the interpreter the builder's venv links to is in the image.
    interpreter = _resolve(tree, "/opt/gpu-webhook/bin/python3")
    assert interpreter != "/opt/gpu-webhook/bin/python3"
    assert interpreter in tree and tree[interpreter].executable, f"the venv's python3 leads to {interpreter}"
    assert re.fullmatch(r"/usr(/local)?/bin/python3\.11", interpreter), interpreter
    assert tree["/opt/gpu-webhook/bin/gpu-webhook"].executable


def test_image_size(tree):
    size = sum(entry.size for entry in tree.values() if stat.S_ISREG(entry.mode))
    assert size < MAX_UNPACKED_BYTES, f"{size / 1e6:.0f} MB unpacked"


# --- running it -----------------------------------------------------------------------------------


def _run(image, work: Path, name: str, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return oci.run(image, work / "rootfs", work / f"bundle-{name}", work / "state", f"gpu-webhook-test-{name}",
                   args, **kwargs)


def test_version(image, rootfs):
    result = _run(image, rootfs, "version", ["--version"])
    assert (result.returncode, result.stdout.strip()) == (0, f"gpu-webhook {webhook.__version__}"), result.stderr


def test_check_an_example(image, rootfs):
    result = _run(image, rootfs, "check", ["check", "/examples/cuda-vector-add.yaml"],
                  binds={"/examples": ROOT / "examples"})
    assert result.returncode == 0, result.stdout + result.stderr


def test_inside_no_pip_and_no_compiler(image, rootfs):
    probe = ("import importlib.util as u, shutil; "
             "print([m for m in ('pip', 'setuptools', 'wheel', 'ensurepip') if u.find_spec(m)], "
             "[t for t in ('pip', 'pip3', 'gcc', 'cc', 'c++', 'clang', 'ld') if shutil.which(t)])")
    result = _run(image, rootfs, "probe", ["-c", probe], entrypoint=["python3"])
    assert (result.returncode, result.stdout.strip()) == (0, "[] []"), result.stderr
    result = _run(image, rootfs, "whoami", ["-c", "id -u; id -g"], entrypoint=["/bin/sh"])
    assert result.stdout.split() == ["65532", "65532"], result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, context: ssl.SSLContext, path: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("POST" if body else "GET", path, body=body or None,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _listeners(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port``, from /proc/net/tcp and tcp6 (state 0A)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port and len(address) == width:
                found.add(address)
    return found


@pytest.mark.slow
def test_default_command_listens_on_every_interface(image, rootfs):
    """The image's own CMD (only the port moved to a free one): its socket is bound to the wildcard address, so
    a published port reaches it. With the old default, `serve --self-signed`, it was 127.0.0.1 (0100007F)."""
    port = _free_port()
    name = "gpu-webhook-test-default"
    log = rootfs / "default.log"
    proc, _ = oci.start(image, rootfs / "rootfs", rootfs / "bundle-default", rootfs / "state", name,
                        [*image.runtime["Cmd"], "--port", str(port)], log)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not _listeners(port):
            time.sleep(0.2)
        listening = _listeners(port)
    finally:
        code = oci.stop(proc, rootfs / "state", name)
    text = log.read_text(errors="replace")
    assert listening, f"nothing listened on {port}; log:\n{text}"
    assert listening <= {"00000000", "0" * 32}, f"bound to {listening} (hex), not to every interface"
    assert code == 0, text


@pytest.mark.slow
def test_serve_self_signed_on_a_read_only_root(image, rootfs):
    port = _free_port()
    name = "gpu-webhook-test-serve"
    log = rootfs / "serve.log"
    proc, tmp = oci.start(image, rootfs / "rootfs", rootfs / "bundle-serve", rootfs / "state", name,
                          ["serve", "--self-signed", "--host", "127.0.0.1", "--port", str(port)], log)
    try:
        deadline = time.monotonic() + 60
        health = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"self-signed CA: /tmp/(\S+)", log.read_text(errors="replace"))
            if found:
                try:
                    context = ssl.create_default_context(cafile=str(tmp / found.group(1)))
                    health = _post(port, context, "/healthz", b"")
                    break
                except (OSError, ssl.SSLError):
                    pass
            time.sleep(0.2)
        assert health == (200, b"ok\n"), f"no /healthz answer; log:\n{log.read_text(errors='replace')}"
        review = (ROOT / "examples" / "reviews" / "cuda-vector-add.json").read_bytes()
        status, body = _post(port, context, "/validate", review)
        assert status == 200 and json.loads(body)["response"]["allowed"] is True
        status, body = _post(port, context, "/validate", (ROOT / "examples" / "reviews" / "bad-gpu.json").read_bytes())
        assert status == 200 and json.loads(body)["response"]["allowed"] is False
        # The root filesystem is read-only; what the server wrote is all in /tmp, owned by its user.
        written = {p.name: p.stat().st_uid for p in tmp.iterdir()}
        assert written and all(n.startswith("gpu-webhook-") for n in written), written
        assert set(written.values()) == {int(USER.split(":")[0])}, written
    finally:
        code = oci.stop(proc, rootfs / "state", name)
    text = log.read_text(errors="replace")
    assert code == 0, text
    # Any write outside /tmp would have failed on the read-only root and been logged.
    assert "Read-only file system" not in text and "[ERROR]" not in text, text


# --- the image recipes of docs/cli.md, in a user's repository -------------------------------------------------


def _docker_run(command: str, workspace: Path) -> tuple[dict[str, tuple[Path, bool]], str, str, list[str], str]:
    """What ``docker run … > FILE`` asks of docker: its volumes (container path: host path, writable), working
    directory, image, arguments, and the file the step's shell writes the output to. Only the options the
    recipe uses are understood; any other one fails the test."""
    line, _, redirect = command.partition(" > ")
    words = shlex.split(line)
    assert words[:2] == ["docker", "run"], command
    volumes: dict[str, tuple[Path, bool]] = {}
    workdir, rest = "", words[2:]
    while rest[0].startswith("-"):
        option, *rest = rest
        if option == "--rm":
            continue
        value, *rest = rest
        if option == "-v":
            source, destination, mode = value.replace("$PWD", str(workspace)).split(":")
            volumes[destination] = (Path(source), mode != "ro")
        elif option == "-w":
            workdir = value
        else:
            raise AssertionError(f"docker run option {option} is not understood here: {command}")
    image_ref, *args = rest
    return volumes, workdir, image_ref, args, redirect.strip()


def _checked_out(repo: Path, writable: bool) -> None:
    """Modes as a runner's checkout has them: readable by every user (a git checkout under umask 022, as on a
    GitHub runner), or writable by every user too (GitLab's Docker executor clones under umask 0000)."""
    for path in [repo, *repo.rglob("*")]:
        if ".git" in path.relative_to(repo).parts:
            continue
        path.chmod((0o777 if path.is_dir() else 0o666) if writable else (0o755 if path.is_dir() else 0o644))


def test_the_github_image_recipe_runs_check_in_the_image(image, rootfs, tmp_path):
    """The `docker run` step as docker would run it: the checkout mounted read-only as the working directory,
    the image's entrypoint and user, its output written by the step's shell outside the container."""
    [command] = recipes.recipes()["github", "image"].commands
    user = recipes.user_repo(tmp_path / "user")
    volumes, workdir, image_ref, args, report = _docker_run(command, user)
    assert image_ref == recipes.image_ref(webhook.__version__) and image.ref_name.endswith(f":{webhook.__version__}")
    assert volumes == {workdir: (user, False)} and report == "gpu-webhook.sarif"

    def step(name: str) -> subprocess.CompletedProcess:
        _checked_out(user, writable=False)
        done = _run(image, rootfs, name, args, binds={d: s for d, (s, _) in volumes.items()}, cwd=workdir)
        (user / report).write_text(done.stdout)
        return done

    good = step("recipe-github-good")
    assert (good.returncode, good.stderr) == (0, f"{len(recipes.GOOD)} objects checked, 0 denied, 0 warned\n")
    assert json.loads((user / report).read_text())["runs"][0]["results"] == []
    bad_name = recipes.add_bad_manifest(user)
    bad = step("recipe-github-bad")
    assert (bad.returncode, bad.stderr) == (1, f"{len(recipes.GOOD) + 1} objects checked, 1 denied, 0 warned\n")
    [result] = json.loads((user / report).read_text())["runs"][0]["results"]
    assert result["ruleId"] == recipes.BAD_RULE
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == bad_name


def test_the_gitlab_image_recipe_runs_its_script_in_the_image(image, rootfs, tmp_path):
    """The job's image with its entrypoint emptied: each script line run by the image's shell, as the image's
    user, in the checkout (writable, as GitLab's runner leaves it), which gets the JUnit report."""
    recipe = recipes.recipes()["gitlab", "image"]
    assert recipe.job["image"] == {"name": recipes.image_ref(webhook.__version__), "entrypoint": [""]}
    [line] = recipe.commands
    assert recipe.job["artifacts"]["reports"]["junit"] == "gpu-webhook.xml" and line.endswith("> gpu-webhook.xml")
    user = recipes.user_repo(tmp_path / "user")
    project_dir = "/builds/team/user"

    def job(name: str) -> subprocess.CompletedProcess:
        _checked_out(user, writable=True)
        return _run(image, rootfs, name, ["-c", line], entrypoint=["/bin/sh"], binds={project_dir: user},
                    writable={project_dir}, cwd=project_dir)

    good = job("recipe-gitlab-good")
    assert (good.returncode, good.stderr) == (0, f"{len(recipes.GOOD)} objects checked, 0 denied, 0 warned\n")
    report = user / "gpu-webhook.xml"
    assert report.stat().st_uid == int(USER.split(":")[0]) and "<failure " not in report.read_text()
    bad_name = recipes.add_bad_manifest(user)
    bad = job("recipe-gitlab-bad")
    assert (bad.returncode, bad.stderr) == (1, f"{len(recipes.GOOD) + 1} objects checked, 1 denied, 0 warned\n")
    junit = report.read_text()
    assert junit.count("<failure ") == 1 and f'type="{recipes.BAD_RULE}"' in junit and f'file="{bad_name}"' in junit
