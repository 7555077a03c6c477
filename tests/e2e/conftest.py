"""Session fixtures for the end-to-end suite: a real control plane, stopped and deleted at the end; and the
apiserver version matrix (``matrix_cluster``)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Bed, ControlPlane, matrix_beds
from tests.tools import (
    CONTROL_PLANE_BINARIES,
    apiserver_bin,
    control_plane_bin,
    matrix_versions,
    missing_binaries,
    unavailable,
    versions,
)


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    """The control plane tests/prepare built; never built here (a fixture has only the test timeout)."""
    directory = control_plane_bin()
    missing = missing_binaries(directory, CONTROL_PLANE_BINARIES)
    if missing:
        unavailable("e2e control plane", f"{', '.join(missing)} not built in {directory}", "control-plane")
    return directory


def running(plane: ControlPlane, what: str) -> Iterator[ControlPlane]:
    """Start ``plane``, yield it, stop it; a start that fails fails the test with the processes' logs."""
    try:
        plane.start()
    except Exception as exc:
        logs = "\n".join(f"--- {p.name}\n{p.log.read_text()[-2000:]}" for p in plane.processes if p.log.exists())
        plane.stop()
        pytest.fail(f"{what} did not start: {exc}\n{logs}", pytrace=False)
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def cluster(bin_dir):
    yield from running(ControlPlane(bin_dir, Path(tempfile.mkdtemp(prefix="gpu-webhook-e2e-"))),
                       "the e2e control plane")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test on a matrix bed whose kube-apiserver died of its own open bug (kubernetes/kubernetes issue 135757,
    ``native_bed.UPSTREAM_CRASH``) runs once more: the apiserver is started again on its etcd, as the kubelet
    restarts it in a cluster, and the crash is printed on stderr. The apiserver compiles the policies stored in etcd
    anew, asynchronously (the 1.30 bed's take up to a minute), so each of the test's fixtures that can tell is first
    waited for: those whose value has ``wait_enforced()``, which returns once the fixture's policies act again. Any
    other failure, and a failure of the second run, stands."""
    try:
        return (yield)
    except Exception:
        from tests.e2e.native_bed import upstream_crash

        funcargs = getattr(item, "funcargs", {})
        cluster = funcargs.get("matrix_cluster")
        if not isinstance(cluster, ControlPlane) or not upstream_crash(cluster):
            raise
    for name, value in funcargs.items():
        wait = getattr(value, "wait_enforced", None)
        if callable(wait):
            wait()
            print(f"{item.nodeid}: fixture {name}'s policies act again after the restart", file=sys.stderr)
    print(f"{item.nodeid}: run again after the kube-apiserver crash", file=sys.stderr)
    item.runtest()
    return None


# The version matrix: the main bed's version and MATRIX_KUBERNETES_VERSIONS of versions.env, oldest first, with
# the MutatingAdmissionPolicy variants of tests/e2e/cluster.py matrix_beds (ids "1.30", "1.34", "1.34-map-beta",
# "1.36", "1.36-map-off", "1.37").
MATRIX_BEDS = matrix_beds([versions()["KUBERNETES_VERSION"], *matrix_versions()])


@pytest.fixture(scope="module", params=MATRIX_BEDS, ids=[bed.id for bed in MATRIX_BEDS])
def matrix_cluster(request, bin_dir):
    """One bed of the version matrix: a ControlPlane whose kube-apiserver is ``bed.version`` with the flags
    that version needs, on its own etcd (the main bed's etcd binary), started once per test module and bed.

    Module scope with a parameter makes pytest run a module's tests bed by bed, in MATRIX_BEDS order, and stop
    one bed before it starts the next: only one matrix apiserver runs at a time (2 cores; ~270 MB each). A
    module using it starts every bed (each 3-10 s); put a version's tests in as few modules as possible."""
    bed: Bed = request.param
    binary = apiserver_bin(bed.version)
    if not os.access(binary, os.X_OK):
        step = "control-plane" if bed.version == versions()["KUBERNETES_VERSION"] else "matrix"
        unavailable(f"kube-apiserver {bed.version}", f"not built at {binary}", step)
    workdir = Path(tempfile.mkdtemp(prefix=f"gpu-webhook-matrix-{bed.id}-"))
    yield from running(ControlPlane(bin_dir, workdir, bed), f"the {bed.id} bed (kube-apiserver {bed.version})")


@pytest.fixture(scope="session")
def api(cluster):
    """A kubernetes Python client configured from the bed's kubeconfig."""
    from kubernetes import client, config

    return client.ApiClient(config.new_client_from_config(str(cluster.kubeconfig)).configuration)


E2E_POLICY = """\
accelerator:
  allowed: [nvidia-tesla-p100, nvidia-tesla-k80, nvidia-l4]
  default: nvidia-tesla-k80
limits: {perContainer: 4, perPod: 4}
namespaces:
  research: {accelerator: {default: nvidia-l4}}
  lab: {enforcement: warn}
"""


@pytest.fixture(scope="module")
def gpu_webhook(cluster, tmp_path_factory):
    """Our webhook as its own process, registered by the configurations the Helm chart renders."""
    from tests.e2e.bed import register_webhook, unregister_webhook
    from tests.server import make_certs, start_webhook

    tmp = tmp_path_factory.mktemp("e2e-webhook")
    policy = tmp / "policy.yaml"
    policy.write_text(E2E_POLICY)
    server = start_webhook(tmp, "--policy", str(policy), certs=make_certs(tmp / "tls", "127.0.0.1"))
    try:  # a registration that fails must not leave the server running
        for namespace in ("research", "lab"):
            cluster.kubectl("create", "namespace", namespace)
        register_webhook(cluster, server)
        yield server
    finally:
        unregister_webhook(cluster)
        server.stop()


@pytest.fixture(scope="session")
def node_bed():
    """A second, separate bed with a real node (tests/e2e/node.py): its own control plane, containerd, kubelet
    and kube-proxy in a fresh network namespace. Built by tests/e2e/build-node.sh, never here."""
    from tests.e2e.node import NodeBed, control_plane_bin_dir, images_dir, missing, node_bin_dir

    gaps = missing()
    if gaps:
        unavailable("e2e node bed", "; ".join(gaps), "node")
    for swept in NodeBed.sweep_stale():
        print(f"swept a node bed left by a killed run: {swept}")
    bed = NodeBed(control_plane_bin_dir(), node_bin_dir(), images_dir(),
                  Path(tempfile.mkdtemp(prefix="gw-e2e-node-")))
    try:
        bed.start()
    except Exception as exc:
        logs = bed.logs()
        problems = bed.stop()
        pytest.fail(f"the node bed did not start: {exc}\n{logs}\nteardown: {problems}", pytrace=False)
    RUNNING_NODE_BEDS.append(bed)
    yield bed
    if bed in RUNNING_NODE_BEDS:  # not stopped yet after the node bed's last test (pytest_runtest_teardown below)
        RUNNING_NODE_BEDS.remove(bed)
        problems = bed.stop()
        assert not problems, f"the node bed left things behind: {problems}"


# The node bed while it runs. Its tests run one after another (tests/conftest.py sorts them first; with workers they
# are one scope): once the last of them is torn down, the bed is stopped then, not at the end of the session, where
# its daemons (the controller manager alone takes half a core) would slow every later test.
RUNNING_NODE_BEDS: list = []
STOPPED_NODE_BEDS: list = []


def _uses_node_bed(item: pytest.Item | None) -> bool:
    return item is not None and "node_bed" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A node bed test after the bed was stopped (its tests were not run one after another) fails, saying why."""
    if STOPPED_NODE_BEDS and _uses_node_bed(item):
        pytest.fail("the node bed was stopped after the node tests before this one: run them one after another "
                    "(tests/conftest.py's order)", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a node bed test whose next test does not use the bed (and after pytest tore down its module's
    fixtures), stop the bed; a problem fails that test's teardown."""
    result = yield
    if RUNNING_NODE_BEDS and _uses_node_bed(item) and not _uses_node_bed(nextitem):
        bed = RUNNING_NODE_BEDS.pop()
        STOPPED_NODE_BEDS.append(bed)
        problems = bed.stop()
        assert not problems, f"the node bed left things behind: {problems}"
    return result


@pytest.fixture(scope="session")
def webhook_archive() -> Path:
    """The OCI archive tests/image/build-image.sh built for this tree (tests/prepare image); never built here."""
    import subprocess

    from tests.tools import ROOT

    path = Path(subprocess.run([str(ROOT / "tests" / "image" / "build-image.sh"), "--print-archive"], check=True,
                               capture_output=True, text=True, timeout=60).stdout.strip())
    if not path.is_file():
        unavailable("webhook image", f"no OCI archive for this tree at {path}", "image")
    return path


@pytest.fixture(scope="session")
def webhook_image(node_bed, webhook_archive) -> str:
    """The project's image imported into the node's containerd: its reference (repository:tag)."""
    import time

    start = time.monotonic()
    names = node_bed.import_image(webhook_archive)
    node_bed.timings["webhook image import"] = time.monotonic() - start
    reference = next((n for n in names if "gpu-webhook" in n), None)
    assert reference, f"no gpu-webhook image among {names} imported from {webhook_archive}"
    return reference
