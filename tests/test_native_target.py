"""``webhook.native.target``: which engine carries which half on a cluster, from helm's flags offline or from
discovery, and which CEL a version's apiserver accepts in a new expression."""

from __future__ import annotations

import pytest

from webhook.native.target import (
    LIBRARIES,
    NEWEST,
    OLDEST,
    Target,
    TargetError,
    every_version,
    for_version,
    from_discovery,
    parse_minor,
)

MAP_BETA = "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"
MAP_V1 = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


@pytest.mark.parametrize("text, minor", [
    ("1.30", 30), ("v1.34.2", 34), ("1.34.0-gke.100", 34), ("v1.37.2+k3s1", 37), ("1.36.0-eks-1234abc", 36),
])
def test_a_version_is_read_as_helm_and_managed_clusters_write_it(text, minor):
    assert parse_minor(text) == minor


@pytest.mark.parametrize("text", ["", "banana", "2.0", "1", "v1.x", "1.30 "[:-1] + "a"])
def test_a_version_that_is_none_is_refused(text):
    with pytest.raises(TargetError):
        parse_minor(text)


# (helm's --kube-version, --api-versions) -> (validation, mutation, the MutatingAdmissionPolicy version)
ENGINES = [
    ("1.30", [], ("native", "webhook"), None),
    ("1.33", [], ("native", "webhook"), None),
    ("1.34", [], ("native", "webhook"), None),  # v1beta1 is off unless the cluster turns it on
    ("1.34", [MAP_BETA], ("native", "native"), "v1beta1"),
    ("1.35", [MAP_BETA], ("native", "native"), "v1beta1"),
    ("1.33", [MAP_BETA], ("native", "webhook"), None),  # no v1beta1 before 1.34 (1.32 and 1.33 had v1alpha1)
    ("1.35", [MAP_V1], ("native", "webhook"), None),  # no v1 before 1.36: a flag cannot make it so
    ("1.36", [], ("native", "native"), "v1"),
    ("1.37", [MAP_BETA], ("native", "native"), "v1"),  # v1 preferred
]


@pytest.mark.parametrize("version, api_versions, engines, mutating", ENGINES)
def test_helm_flags_choose_the_engines_as_the_chart_does(version, api_versions, engines, mutating):
    target = for_version(version, api_versions)
    assert target.engines == engines
    assert target.mutating == mutating


def test_a_cluster_older_than_1_30_is_left_to_the_webhook_alone():
    with pytest.raises(TargetError, match="1.30 or later"):
        for_version("1.29")


@pytest.mark.parametrize("item", ["a/b/c/d", "apps//v1", "apps/v1 ", ""])
def test_an_api_version_that_is_none_is_refused(item):
    with pytest.raises(TargetError):
        for_version("1.34", [item])


# What discovery finds per version of admissionregistration.k8s.io -> the target.
DISCOVERED = [
    (30, {"v1": {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}}, True, None),
    (34, {"v1": {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"},
          "v1beta1": {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}}, True, "v1beta1"),
    # The policy without its binding (one resource turned off): not usable, as Kyverno decides.
    (34, {"v1": {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"},
          "v1beta1": {"MutatingAdmissionPolicy"}}, True, None),
    (36, {"v1": {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy",
                 "MutatingAdmissionPolicyBinding"}}, True, "v1"),
    # 1.36 with MutatingAdmissionPolicy turned off.
    (36, {"v1": {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}}, True, None),
    (29, {}, False, None),
]


@pytest.mark.parametrize("minor, served, validating, mutating", DISCOVERED)
def test_discovery_chooses_what_the_cluster_serves(minor, served, validating, mutating):
    target = from_discovery(minor, served)
    assert (target.validating, target.mutating) == (validating, mutating)


def test_a_library_is_usable_from_the_minor_after_the_one_that_brought_it():
    """An apiserver checks a new expression against its minor minus one (base.go's DefaultCompatibilityVersion):
    two-variable comprehensions arrived in 1.32, so 1.33 accepts them; ext.Lists v3 in 1.34, so 1.35."""
    assert LIBRARIES["two-variable comprehensions"][0] == 32 and LIBRARIES["lists"][0] == 34
    assert not Target(32, True, None).has("two-variable comprehensions")
    assert Target(33, True, None).has("two-variable comprehensions")
    assert not Target(34, True, None).has("lists") and Target(35, True, None).has("lists")


def test_the_documented_versions_are_every_minor_and_the_beta_variants():
    rows = [(t.minor, t.mutating) for t in every_version()]
    assert rows[0] == (OLDEST, None) and rows[-1] == (NEWEST, "v1")
    assert (34, "v1beta1") in rows and (35, "v1beta1") in rows and (34, None) in rows
    assert [t.describe() for t in every_version()][0] == (
        "Kubernetes 1.30 (no MutatingAdmissionPolicy): validation native, mutation webhook")


def rows(table: str) -> dict[tuple[str, str], list[str]]:
    """(version, MutatingAdmissionPolicy column) -> the row's cells."""
    out = {}
    for line in table.splitlines()[2:]:
        if line.startswith("| 1."):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[(cells[0], cells[2])] = cells
    return out


def test_the_versions_table_says_per_version_what_stays_with_the_webhook():
    from webhook.core.policyfile import parse_policy
    from webhook.native.generate import versions_table

    table = versions_table(parse_policy("{}"))
    found = rows(table)
    assert len(found) == len(every_version())
    oldest = found[("1.30", "-")]
    assert oldest[3:5] == ["native", "webhook"]
    for left in ("gpu-device-mount", "DRA rules on ResourceClaims", "mutation (accelerator"):
        assert left in oldest[5]
    assert found[("1.34", "v1beta1")][3:] == ["native", "native", "gpu-device-mount"]
    assert found[("1.35", "-")][5] == "mutation (accelerator, tolerations, hideGpus, runtimeClass)"
    assert found[("1.36", "v1")][3:] == ["native", "native", "nothing more"]
    # What no version carries is said once, after the table.
    [always] = [line for line in table.splitlines() if line.startswith("On every version the webhook keeps: ")]
    assert "process-count-mismatch" in always and "process-count-mismatch" not in oldest[5]


def test_the_command_prints_the_table_and_takes_no_cluster_flags(capsys):
    from webhook.cli.main import main
    from webhook.core.policyfile import parse_policy
    from webhook.native.generate import versions_table

    assert main(["admission-policies", "--versions"]) == 0
    assert capsys.readouterr().out == versions_table(parse_policy("{}"))
    with pytest.raises(SystemExit) as exc:
        main(["admission-policies", "--versions", "--kube-version", "1.30"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--versions covers every version: it takes "
                                                                     "--policy only")


@pytest.mark.parametrize(("version", "mode", "warned"), [
    ("1.30", "live", True), ("1.31", "live", False), ("1.37", "live", False), ("1.30", "inline", False)])
def test_live_policies_for_1_30_come_with_the_known_crash(tmp_path, capsys, version, mode, warned):
    """kube-apiserver 1.30 crashed evaluating the live policies (kubernetes/kubernetes issue 135757): the command
    says so where it generates them, and names the way around it."""
    from webhook.cli.main import main

    policy = tmp_path / "policy.yaml"
    policy.write_text(f"nativePolicies: {{params: {mode}}}\n")
    assert main(["admission-policies", "--policy", str(policy), "--kube-version", version]) == 0
    err = capsys.readouterr().err
    assert ("issue 135757" in err and "nativePolicies.params: inline avoids it" in err) is warned, err
