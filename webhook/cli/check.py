"""``gpu-webhook check``: the webhook's validation, offline, for manifests in a CI pipeline.

Each object goes through ``admission.decide``, the very function behind ``/validate``,
so a manifest that passes here is admitted by the server with the same policy.

Input is read as a stream and decided object by object (:mod:`webhook.manifests`), so memory follows the largest
document, not the file. A broken document is reported by file and number and the others are still checked. An
AdmissionReview is decided as ``/validate`` decides it: its ``request.object``, in its namespace.

Every violation is reported at the line and column of its field (the YAML node or JSON key of its field path,
or of the closest ancestor that exists when the field is missing).

A GPUPolicy among the inputs is a policy, not a workload: it is checked as the apiserver and the webhook would
check it (``webhook.core.policycheck``), each problem an input problem at its field (exit 2), and a valid one is
counted apart with a note that ``--policy`` checks the workloads with it. It never becomes the policy of the run
by itself: the policy in force is ``--policy``'s, or the defaults, whatever files a directory holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, TextIO

from webhook.cli import formats
from webhook.cli.formats import Checked, Finding, Tally
from webhook.core import gpupolicy, policycheck
from webhook.core.clusterview import ClusterView
from webhook.core.podspecs import as_mapping, group_of
from webhook.core.policy import PolicySet
from webhook.manifests.inputs import (
    CLAIM_KINDS,
    NAMESPACE,
    NAMESPACE_RULE,
    STDIN,
    Item,
    Opened,
    Reading,
    cluster_view,
    helm_template,
    input_files,
    manifest_view,
    mentions_claims,
    read_items,
    with_namespace,
)
from webhook.rules.admission import decide, object_name, validate
from webhook.rules.pods import looks_into

EXIT_ADMITTED, EXIT_DENIED, EXIT_UNREADABLE = formats.EXIT_CLEAN, formats.EXIT_FINDINGS, formats.EXIT_UNREADABLE


def namespace_arg(text: str) -> str:
    """``--namespace`` for argparse: a namespace name, or a one-line error."""
    if not NAMESPACE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name ({NAMESPACE_RULE})")
    return text


def with_cluster_checks(policies: PolicySet) -> PolicySet:
    """``policies`` with the cluster-aware checks on everywhere (``--nodes`` asks for them)."""
    document = {**policies.document, "cluster": {**policies.document["cluster"], "enabled": True}}
    return PolicySet(
        default=dataclasses.replace(policies.default, cluster_enabled=True),
        by_namespace={ns: dataclasses.replace(p, cluster_enabled=True) for ns, p in policies.by_namespace.items()},
        document=document,
    )


# ---------------------------------------------------------------------------------------- decisions


def _identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = as_mapping(obj.get("metadata"))
    name = metadata.get("name") or metadata.get("generateName") or "(unnamed)"
    namespace = metadata.get("namespace")
    return str(name), namespace if isinstance(namespace, str) else ""


def judge(item: Item, source: str, policies: PolicySet, namespace: str, view: ClusterView | None = None) -> Checked:
    """One object and its violations, each with the action the decision took on it and the position of its
    field: ``admission.decide`` for a manifest (in its namespace, else ``namespace``), ``admission.validate`` for
    an AdmissionReview."""
    obj = item.obj
    if item.request is not None:
        request = item.request
        requested = as_mapping(request.get("kind"))
        kind = str(requested.get("kind") or obj.get("kind") or "AdmissionReview")
        name = object_name(request, obj)
        target = request.get("namespace") or _identity(obj)[1]
        target = target if isinstance(target, str) else ""
        answer = validate(request, policies, view)
        group = str(requested.get("group") or "")
    else:
        kind = str(obj["kind"])
        name, own_namespace = _identity(obj)
        target = own_namespace or namespace
        group = group_of(obj.get("apiVersion"))
        answer = decide(obj, group, kind, target, policies, view)
    found = tuple(
        Finding(source, kind, name, target, str(v.path), v.rule, action, v.message, *item.position(str(v.path)))
        for v, action in answer.judged()
    )
    looked = bool(found) or looks_into(obj, group, kind, policies.for_namespace(target))
    return Checked(kind, name, target, item.line, found, looked)


def target_namespace(item: Item, namespace: str) -> str:
    """The namespace an input object is decided in: its request's or its own, else ``--namespace``."""
    if item.request is not None:
        target = item.request.get("namespace") or _identity(item.obj)[1]
        return target if isinstance(target, str) else ""
    return _identity(item.obj)[1] or namespace


def findings(
    obj: Mapping[str, Any], source: str, policies: PolicySet, namespace: str, view: ClusterView | None = None
) -> list[Finding]:
    """The violations of one object, each with the action ``admission.decide`` took on it."""
    return list(judge(Item(obj), source, policies, namespace, view).findings)


def check_objects(
    objects: list[Mapping[str, Any]],
    source: str,
    policies: PolicySet,
    namespace: str,
    view: ClusterView | None = None,
) -> Iterator[tuple[bool, str]]:
    """(denied?, line) for every violation, in the ``FILE: Kind namespace/name: path: message`` form."""
    for obj in objects:
        for finding in findings(obj, source, policies, namespace, view):
            yield finding.action == "deny", finding.text()


@dataclass
class _Run:
    """One ``check`` run: where its findings and problems go, and what it counted."""

    policies: PolicySet
    namespace: str
    writer: formats.Writer
    err: TextIO
    cluster_state: list[Mapping[str, Any]] | None
    skip_others: bool
    policy_file: str | None = None  # --policy
    tally: Tally = field(default_factory=Tally)
    skipped: int = 0  # documents that are not Kubernetes objects
    templates: int = 0  # Helm chart templates
    excluded: set[str] = field(default_factory=set)  # the excludeNamespaces objects were skipped in

    def problem(self, source: str, problem: str, line: int = 0, column: int = 0) -> None:
        where = f"{source}:{line}:{column}" if line else source
        print(f"{where}: {problem}", file=self.err)
        self.tally.problems += 1
        self.writer.problem(source, problem, line, column)

    def policy_object(self, source: str, entry: Item) -> Checked | None:
        """A GPUPolicy: each problem at its field, or, valid, the object to report once its file is read."""
        name = policycheck.name_of(entry.obj)
        found = policycheck.problems(entry.obj)
        placed = sorted((entry.position_at(problem.at), problem.message) for problem in found)
        for (line, column), message in placed:  # in the order of the file
            self.problem(source, f"{gpupolicy.KIND} {name}: {message}", line, column)
        if found:
            return None
        line, column = entry.position_at(())
        return Checked(gpupolicy.KIND, name, "", line, policy=True, column=column)

    def policy_note(self, source: str, policy: Checked, alone: bool) -> Checked:
        """A valid GPUPolicy with what to do with it (``alone``: the only document of its file), said on stderr."""
        if self._is_policy_file(source):
            note = "a valid policy: the one these objects are checked with (--policy)"
        elif alone:
            note = f"a valid policy, not applied to the other objects: to check them with it, give --policy {source}"
        else:
            note = ("a valid policy, not applied to the other objects: to check them with it, give --policy a file "
                    "that holds it alone")
        if policy.name != gpupolicy.NAME:
            note += f" (in a cluster only the one named {gpupolicy.NAME!r} is enforced)"
        where = f"{source}:{policy.line}:{policy.column}" if policy.line else source
        print(f"{where}: {policy.label}: {note}", file=self.err)
        return dataclasses.replace(policy, note=note)

    def _is_policy_file(self, source: str) -> bool:
        if self.policy_file is None or source == STDIN:
            return False
        try:
            return os.path.samefile(source, self.policy_file)
        except OSError:
            return False

    def view(self, stream: IO[bytes], source: str) -> ClusterView | None:
        """The claims of the input in the cluster view (the saved cluster's, or one of their own)."""
        claims: list[Mapping[str, Any]] = []
        if mentions_claims(stream):
            claims = [entry.obj for entry in read_items(stream, source, Reading(self.skip_others))
                      if isinstance(entry, Item) and entry.obj.get("kind") in CLAIM_KINDS]
            stream.seek(0)
        node_label = self.policies.default.node_label
        if self.cluster_state is not None:
            return cluster_view(self.cluster_state, node_label, [with_namespace(o, self.namespace) for o in claims])
        return manifest_view(claims, self.namespace, node_label)

    def check(self, path: str) -> None:
        """Read one input and decide on each object as it is read."""
        if self.skip_others and helm_template(path):
            self.templates += 1
            return
        source = STDIN if path == "-" else path
        reading = Reading(self.skip_others)
        problems = self.tally.problems
        policies: list[tuple[Checked, bool]] = []  # valid GPUPolicy objects, whole documents?, reported at the end
        read = 0  # the objects of the file, GPUPolicy objects included
        self.writer.begin(source)
        try:
            with Opened(path) as stream:
                view = self.view(stream, source)
                for entry in read_items(stream, source, reading):
                    if isinstance(entry, str):
                        self.problem(source, entry)
                        continue
                    read += 1
                    if entry.request is None and policycheck.is_gpupolicy(entry.obj):
                        if (policy := self.policy_object(source, entry)) is not None:
                            policies.append((policy, entry.base == ()))
                        continue
                    target = target_namespace(entry, self.namespace)
                    if self.policies.excludes(target):
                        self.tally.excluded += 1
                        self.excluded.add(target)
                        continue
                    checked = judge(entry, source, self.policies, self.namespace, view)
                    self.tally.add(checked)
                    self.writer.object(source, checked)
        except OSError as exc:
            self.problem(source, f"cannot read: {exc}")
        for policy, whole in policies:
            checked = self.policy_note(source, policy, alone=read == 1 and whole and source != STDIN)
            self.tally.add(checked)
            self.writer.object(source, checked)
        self.skipped += reading.skipped
        lenient = self.skip_others and (path != "-" or reading.skipped)
        if self.tally.problems == problems and not reading.kubernetes and not lenient:
            self.problem(source, "no Kubernetes objects")
        self.writer.end(source)

    def skipped_note(self) -> str:
        parts = []
        if self.skipped:
            parts.append(f"{self.skipped} documents that are not Kubernetes objects" if self.skipped != 1
                         else "1 document that is not a Kubernetes object")
        if self.templates:
            parts.append(f"{self.templates} Helm chart template{'s' if self.templates != 1 else ''} (check what "
                         "helm template renders)")
        if self.tally.excluded:
            count = self.tally.excluded
            parts.append(f"{count} object{'s' if count != 1 else ''} in {', '.join(sorted(self.excluded))}, which "
                         "no engine checks (excludeNamespaces)")
        return f"skipped {' and '.join(parts)}" if parts else ""


def run(
    paths: list[str],
    policies: PolicySet,
    namespace: str = "default",
    out: TextIO | None = None,
    output: str = "text",
    recursive: bool = False,
    err: TextIO | None = None,
    cluster_state: list[Mapping[str, Any]] | None = None,
    fail_on: str = "deny",
    skip_others: bool = False,
    docs_url: str = "",
    policy_file: str | None = None,
) -> int:
    """Check every file, object by object as it is read; write what was found on ``out`` in the ``output``
    format (:mod:`webhook.cli.formats`) as it is found, each input problem and a summary on ``err``.
    ``cluster_state`` holds Nodes, ResourceSlices, DeviceClasses, ... (from
    :func:`webhook.manifests.inputs.read_cluster_state`) for the cluster-aware checks. ``skip_others`` skips
    documents that are not meant as Kubernetes objects and Helm chart templates instead of refusing them.
    ``docs_url`` is where the documentation site is published (SARIF links each rule's page there);
    ``policy_file`` is the file ``policies`` were read from (``--policy``), named when a GPUPolicy input is it. The
    exit code: 2 when an input could not be read, else 1 when a violation is denied (or with
    ``fail_on="warning"``, warned about), else 0."""
    out, err = out or sys.stdout, err or sys.stderr
    writes = formats.writer(output, out, fail_on, docs_url)
    checking = _Run(policies, namespace, writes, err, cluster_state, skip_others, policy_file)
    for path in paths:
        files, problem = input_files(path, recursive)
        if problem:
            checking.writer.begin(path)
            checking.problem(path, problem)
            checking.writer.end(path)
        for file in files:
            checking.check(file)
    status = checking.tally.status(fail_on)
    checking.writer.finish(checking.tally, status)
    if note := checking.skipped_note():
        print(note, file=err)
    print(checking.tally, file=err)
    return status

