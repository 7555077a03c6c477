"""The e2e beds' versions without starting one: tests/e2e/versions.env read the same by bash (go-build.sh) and
Python (tests/tools.py), where each version's kube-apiserver lives, and the flags and beds of the version matrix
(tests/e2e/cluster.py)."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.cluster import MAP_BETA, MAP_DEFAULT, MAP_OFF, Bed, matrix_beds, minor_of, version_args
from tests.tools import ROOT, apiserver_bin, cache_root, control_plane_bin, matrix_versions, parse_versions, versions

GROUP = "admissionregistration.k8s.io"
MAP_BETA_RUNTIME = (f"--runtime-config={GROUP}/v1beta1/mutatingadmissionpolicies=true,"
                    f"{GROUP}/v1beta1/mutatingadmissionpolicybindings=true")
MAP_OFF_RUNTIME = (f"--runtime-config={GROUP}/v1/mutatingadmissionpolicies=false,"
                   f"{GROUP}/v1/mutatingadmissionpolicybindings=false")


@pytest.mark.parametrize(("minor", "mutating_policy", "args"), [
    (30, MAP_DEFAULT, ["--disable-admission-plugins=ServiceAccount"]),
    (34, MAP_DEFAULT, ["--disable-admission-plugins=ServiceAccount"]),
    (34, MAP_BETA, ["--disable-admission-plugins=ServiceAccount", "--feature-gates=MutatingAdmissionPolicy=true",
                    MAP_BETA_RUNTIME]),
    (35, MAP_BETA, ["--disable-admission-plugins=ServiceAccount", "--feature-gates=MutatingAdmissionPolicy=true",
                    MAP_BETA_RUNTIME]),
    (36, MAP_DEFAULT, ["--disable-admission-plugins=ServiceAccount"]),
    (36, MAP_OFF, ["--disable-admission-plugins=ServiceAccount,MutatingAdmissionPolicy", MAP_OFF_RUNTIME]),
    (37, MAP_OFF, ["--disable-admission-plugins=ServiceAccount,MutatingAdmissionPolicy", MAP_OFF_RUNTIME]),
])
def test_version_args(minor, mutating_policy, args):
    assert version_args(minor, mutating_policy) == args


@pytest.mark.parametrize(("minor", "mutating_policy", "error"), [
    (33, MAP_BETA, "MutatingAdmissionPolicy v1beta1 is a 1.34 and 1.35 API, not 1.33's"),
    (36, MAP_BETA, "MutatingAdmissionPolicy v1beta1 is a 1.34 and 1.35 API, not 1.36's"),
    (35, MAP_OFF, "1.35 serves no MutatingAdmissionPolicy by default: nothing to turn off"),
    (36, "on", "mutating_policy must be 'default', 'beta' or 'off', got 'on'"),
])
def test_version_args_refuses_what_the_version_cannot_do(minor, mutating_policy, error):
    with pytest.raises(ValueError) as raised:
        version_args(minor, mutating_policy)
    assert str(raised.value) == error


@pytest.mark.parametrize(("version", "minor"), [("v1.30.14", 30), ("1.37", 37), ("v1.36.0-rc.1", 36)])
def test_minor_of(version, minor):
    assert minor_of(version) == minor


@pytest.mark.parametrize("version", ["v2.1.0", "1", "v1.x.3", ""])
def test_minor_of_refuses_non_versions(version):
    with pytest.raises(ValueError, match="not a Kubernetes 1.x version"):
        minor_of(version)


def test_matrix_beds_oldest_first_with_the_mutating_policy_variants():
    beds = matrix_beds(["v1.36.3", "v1.37.2", "v1.30.14", "v1.34.4", "v1.30.14"])
    assert [(bed.id, bed.version) for bed in beds] == [
        ("1.30", "v1.30.14"), ("1.34", "v1.34.4"), ("1.34-map-beta", "v1.34.4"), ("1.36", "v1.36.3"),
        ("1.36-map-off", "v1.36.3"), ("1.37", "v1.37.2"), ("1.37-map-off", "v1.37.2"),
    ]


def test_matrix_beds_refuses_two_patches_of_a_minor():
    with pytest.raises(ValueError, match="one version per minor"):
        matrix_beds(["v1.34.4", "v1.34.3"])


def test_bed_args_are_its_versions():
    assert Bed("v1.34.4", MAP_BETA).args() == version_args(34, MAP_BETA)


def test_apiserver_bin_main_version_is_the_control_planes_and_others_the_matrix():
    main = versions()["KUBERNETES_VERSION"]
    assert apiserver_bin(main) == control_plane_bin() / "kube-apiserver"
    assert apiserver_bin("v1.30.14") == cache_root() / "control-plane" / "apiserver-v1.30.14" / "bin" / "kube-apiserver"


def test_matrix_versions_are_distinct_minors_other_than_the_main_beds():
    minors = [minor_of(v) for v in [versions()["KUBERNETES_VERSION"], *matrix_versions()]]
    assert len(matrix_versions()) >= 1
    assert len(set(minors)) == len(minors), minors


def test_parse_versions_keeps_a_lists_spaces_and_drops_comments():
    text = "# pins\nA=v1  # trailing\n  B = x y  z \n\nnot a pair\nC=k=v\n"
    assert parse_versions(text) == {"A": "v1", "B": "x y  z", "C": "k=v"}


@pytest.mark.process
def test_bash_and_python_read_versions_env_alike():
    """go-build.sh's read_versions ignores (with a warning) a key it does not know: every key of versions.env
    must be one of its VERSION_KEYS, and the values must be what tests/tools.py reads."""
    script = ('HERE=tests/e2e; source tests/e2e/go-build.sh; read_versions; '
              'for k in "${VERSION_KEYS[@]}"; do [[ -v $k ]] && printf "%s=%s\\n" "$k" "${!k}"; done; true')
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert done.returncode == 0, done.stderr
    assert "ignoring unknown key" not in done.stderr
    assert parse_versions(done.stdout) == versions()
