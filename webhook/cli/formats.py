"""What ``gpu-webhook check`` found, written for a person or for a CI system.

``text`` is one line per violation, ``FILE:LINE:COLUMN: Kind namespace/name: path: message``; ``jsonl`` one
JSON object per violation and line; ``json`` one JSON document with every violation, the input problems and a
summary; ``junit`` JUnit XML as Jenkins and GitLab read it (one testsuite per input file, one testcase per
object, a ``<failure>`` per violation that fails the run); ``sarif`` SARIF 2.1.0 as code scanning reads it (the
rule table as ``tool.driver.rules`` with each rule's help, each result at the line and column of its field).

Writers are told of each object as it is decided: ``text`` and ``jsonl`` write its lines at once; ``json`` and
``sarif`` keep the findings alone until the end; ``junit`` writes each testcase to a temporary file, since a
testsuite's counts come before its testcases.

A violation fails the run when it is denied, or with ``--fail-on warning`` when it is only warned about; the
JUnit report makes failures of exactly those, so the report and the exit code agree. The XML is written with
the standard library's ElementTree: five element kinds do not call for a dependency in the image.
"""

from __future__ import annotations

import json
import re
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import PurePath
from typing import IO, Any, TextIO
from urllib.parse import quote
from xml.sax.saxutils import quoteattr

from webhook import __version__
from webhook.core.catalog import RULES, Rule, page_url
from webhook.manifests.inputs import STDIN

OUTPUTS = ("text", "json", "jsonl", "junit", "sarif")
FAIL_ON = ("deny", "warning")
EXIT_CLEAN, EXIT_FINDINGS, EXIT_UNREADABLE = 0, 1, 2
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


@dataclass(frozen=True)
class Finding:
    """One violation of one object, as ``check`` reports it."""

    file: str
    kind: str
    name: str
    namespace: str
    path: str
    rule: str
    action: str  # deny or warn
    message: str
    line: int = 0  # the file's line of the field (or of its closest ancestor that exists); 0: not known
    column: int = 0  # its column, from 1

    @property
    def object(self) -> str:
        return object_label(self.kind, self.namespace, self.name)

    @property
    def where(self) -> str:
        """``FILE:LINE:COLUMN``, as compilers and editors write a position; the file alone when it is not known."""
        return f"{self.file}:{self.line}:{self.column}" if self.line > 0 else self.file

    def text(self) -> str:
        note = "" if self.action == "deny" else "warning: "
        return f"{self.where}: {self.object}: {self.path}: {note}{self.message}"

    def record(self) -> dict[str, str | int]:
        """The ``-o jsonl`` object, also each of ``-o json``'s findings."""
        return {"file": self.file, "line": self.line, "column": self.column, "kind": self.kind, "name": self.name,
                "namespace": self.namespace, "path": self.path, "rule": self.rule, "action": self.action,
                "message": self.message}


def object_label(kind: str, namespace: str, name: str) -> str:
    """``Pod team-a/trainer``: the kind, then the name as Kubernetes writes a namespaced one (namespace/name)."""
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


@dataclass(frozen=True)
class Checked:
    """One object and what was found in it."""

    kind: str
    name: str
    namespace: str
    line: int  # where the object starts; 0: not known
    findings: tuple[Finding, ...] = ()
    looked: bool = True  # the rules had something to read in it (a pod spec, a resource block, device requests)
    policy: bool = False  # a valid GPUPolicy: a policy, not a workload to decide on
    column: int = 0  # where the object starts, its column; 0: not known
    note: str = ""  # what to do with it (a GPUPolicy: check the workloads with it)

    @property
    def label(self) -> str:
        return object_label(self.kind, self.namespace, self.name)


@dataclass
class Tally:
    """Objects checked, denied (one denial or more) and warned (one warning or more: an object can be both),
    the violations by action, and the input problems."""

    objects: int = 0
    policies: int = 0  # valid GPUPolicy objects (counted apart from objects: a policy is not decided on)
    nothing: int = 0  # objects with nothing to check: no pod spec, resource block or GPU quantity (a ConfigMap)
    excluded: int = 0  # objects in excludeNamespaces, not checked (counted apart from objects)
    denied: int = 0
    warned: int = 0
    denials: int = 0
    warnings: int = 0
    problems: int = 0

    def add(self, checked: Checked) -> None:
        if checked.policy:
            self.policies += 1
            return
        self.objects += 1
        self.nothing += not checked.looked and not checked.findings
        denials = sum(f.action == "deny" for f in checked.findings)
        warnings = len(checked.findings) - denials
        self.denials += denials
        self.warnings += warnings
        self.denied += denials > 0
        self.warned += warnings > 0

    def status(self, fail_on: str) -> int:
        if self.problems:
            return EXIT_UNREADABLE
        if self.denials or (fail_on == "warning" and self.warnings):
            return EXIT_FINDINGS
        return EXIT_CLEAN

    def summary(self) -> dict[str, int]:
        return {"objects": self.objects, "nothingToCheck": self.nothing, "excluded": self.excluded,
                "policies": self.policies,
                "denied": self.denied, "warned": self.warned, "denials": self.denials, "warnings": self.warnings,
                "problems": self.problems}

    def __str__(self) -> str:
        """``3 objects checked, 1 denied, 0 warned``: the objects the rules looked into, after those with nothing
        to check (no pod spec, resource block, device request or GPU quantity) when there are any."""
        looked = self.objects - self.nothing
        text = f"{looked} object{'' if looked == 1 else 's'} checked, {self.denied} denied, {self.warned} warned"
        if self.nothing:
            text = f"{self.nothing} object{'' if self.nothing == 1 else 's'} with nothing to check; {text}"
        if self.policies:
            text = f"{self.policies} GPUPolicy valid; {text}" if self.policies == 1 else \
                f"{self.policies} GPUPolicies valid; {text}"
        return text


def fails(finding: Finding, fail_on: str) -> bool:
    return finding.action == "deny" or fail_on == "warning"


class Writer:
    """Told of each input file (``begin``, ``end``), its problems and each object decided in it as they come;
    then ``finish`` writes what needs all of them."""

    def __init__(self, out: TextIO, fail_on: str = "deny"):
        self.out = out
        self.fail_on = fail_on

    def begin(self, source: str) -> None:
        pass

    def problem(self, source: str, problem: str, line: int = 0, column: int = 0) -> None:
        """An input problem; ``line`` and ``column`` say where when it is one field's (an invalid GPUPolicy)."""

    def object(self, source: str, checked: Checked) -> None:
        pass

    def end(self, source: str) -> None:
        pass

    def finish(self, tally: Tally, status: int) -> None:
        pass


class Text(Writer):
    def object(self, source: str, checked: Checked) -> None:
        for finding in checked.findings:
            print(finding.text(), file=self.out)


class JsonLines(Writer):
    def object(self, source: str, checked: Checked) -> None:
        for finding in checked.findings:
            print(json.dumps(finding.record()), file=self.out)


class JsonDocument(Writer):
    def __init__(self, out: TextIO, fail_on: str = "deny"):
        super().__init__(out, fail_on)
        self.findings: list[dict[str, str | int]] = []
        self.problems: list[dict[str, str | int]] = []
        self.policies: list[dict[str, str | int]] = []

    def problem(self, source: str, problem: str, line: int = 0, column: int = 0) -> None:
        entry: dict[str, str | int] = {"file": source, "problem": problem}
        if line:
            entry.update(line=line, column=column)
        self.problems.append(entry)

    def object(self, source: str, checked: Checked) -> None:
        if checked.policy:
            self.policies.append({"file": source, "line": checked.line, "column": checked.column,
                                  "kind": checked.kind, "name": checked.name, "note": checked.note})
        self.findings.extend(f.record() for f in checked.findings)

    def finish(self, tally: Tally, status: int) -> None:
        document = {
            "findings": self.findings,
            "problems": self.problems,
            "policies": self.policies,
            "summary": {**tally.summary(), "failOn": self.fail_on, "exitCode": status},
        }
        self.out.write(json.dumps(document, indent=2) + "\n")


# XML 1.0 has no way to write most control characters, not even escaped: they are shown as \xNN instead.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _spool() -> IO[str]:
    return tempfile.SpooledTemporaryFile(max_size=1 << 20, mode="w+", encoding="utf-8")


def _copy(spool: IO[str], out: TextIO) -> None:
    spool.seek(0)
    for chunk in iter(lambda: spool.read(1 << 16), ""):
        out.write(chunk)
    spool.close()


class JUnit(Writer):
    """JUnit XML: a testsuite per file, a testcase per object (``Pod team-a/trainer``) and per input problem
    (an ``<error>``, before the objects), a ``<failure>`` per violation that fails the run (its ``type`` the rule
    id, its ``message`` the field path and message, its text the file, line and column); warnings that do not
    fail the run go to the testcase's ``<system-out>``. Testcases are written to a temporary file as they come:
    a testsuite's counts come first."""

    def __init__(self, out: TextIO, fail_on: str = "deny"):
        super().__init__(out, fail_on)
        self.body = _spool()  # the testsuites done
        self.totals = {"tests": 0, "failures": 0, "errors": 0}
        self.cases: IO[str] | None = None  # the testcases of the file being read
        self.problems: list[tuple[str, int, int]] = []
        self.counts = dict(self.totals)

    def begin(self, source: str) -> None:
        self.cases, self.problems, self.counts = _spool(), [], {"tests": 0, "failures": 0, "errors": 0}

    def problem(self, source: str, problem: str, line: int = 0, column: int = 0) -> None:
        self.problems.append((problem, line, column))

    def object(self, source: str, checked: Checked) -> None:
        assert self.cases is not None
        case = ET.Element("testcase", name=xml_text(checked.label), classname=xml_text(source))
        self.counts["tests"] += 1
        notes = []
        for finding in checked.findings:
            if fails(finding, self.fail_on):
                failure = ET.SubElement(case, "failure", type=finding.rule,
                                        message=xml_text(f"{finding.path}: {finding.message}"))
                failure.text = xml_text(f"{finding.action} ({finding.rule}) at {finding.path}\n{finding.message}\n"
                                        f"{finding.file}, line {finding.line}, column {finding.column}")
            else:
                notes.append(f"warning ({finding.rule}) at {finding.path}: {finding.message}")
        if any(fails(f, self.fail_on) for f in checked.findings):
            self.counts["failures"] += 1
        if checked.note:
            notes.append(checked.note)
        if notes:
            ET.SubElement(case, "system-out").text = xml_text("\n".join(notes))
        self._case(self.cases, case)

    @staticmethod
    def _case(spool: IO[str], case: ET.Element) -> None:
        ET.indent(case, level=2)
        spool.write("    " + ET.tostring(case, encoding="unicode") + "\n")

    def end(self, source: str) -> None:
        assert self.cases is not None
        problems = _spool()
        for problem, line, column in self.problems:
            case = ET.Element("testcase", name=xml_text(problem), classname=xml_text(source))
            error = ET.SubElement(case, "error", type="unreadable-input", message=xml_text(problem))
            where = f"{source}:{line}:{column}" if line else source
            error.text = xml_text(f"{where}: {problem}")
            self._case(problems, case)
            self.counts["tests"] += 1
            self.counts["errors"] += 1
        counts = " ".join(f"{key}={quoteattr(str(value))}" for key, value in self.counts.items())
        name = quoteattr(xml_text(source))
        self.body.write(f"  <testsuite name={name} file={name} {counts}>\n")
        _copy(problems, self.body)  # type: ignore[arg-type]
        _copy(self.cases, self.body)  # type: ignore[arg-type]
        self.body.write("  </testsuite>\n")
        for key, value in self.counts.items():
            self.totals[key] += value
        self.cases = None

    def finish(self, tally: Tally, status: int) -> None:
        counts = " ".join(f"{key}={quoteattr(str(value))}" for key, value in self.totals.items())
        self.out.write(f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="gpu-webhook check" {counts}>\n')
        _copy(self.body, self.out)
        self.out.write("</testsuites>\n")


def artifact_uri(source: str) -> str:
    """A file as a SARIF ``uri``: relative paths stay relative (code scanning resolves them from the checkout),
    absolute ones become ``file://`` URIs; both percent-encoded."""
    path = PurePath(source)
    if path.is_absolute():
        return "file://" + quote(path.as_posix())
    return quote(path.as_posix())


def _plain(markdown: str) -> str:
    return markdown.replace("`", "")


def rule_help(rule: Rule) -> str:
    """What a rule checks and how to fix what it finds, in Markdown, from the rule table."""
    action = "Refuses" if rule.default == "deny" else "Warns about"
    if rule.setting:
        setting = (f"The policy's `{rule.setting}` sets what it does: `deny`, `warn` or `off` (default "
                   f"`{rule.default}`).")
    else:
        setting = "It follows the policy's `enforcement`: `deny` or `warn`."
    return (f"{action} {rule.refuses}, reported at {rule.reports}.\n\nTo fix it, change the manifest at the "
            f"reported field so that it no longer does this. {setting}")


def sarif_rules(docs_url: str = "") -> list[dict[str, Any]]:
    """``tool.driver.rules``: every rule of the table, its default action as the level, what it checks and how to
    fix it as help; its page on the documentation site as ``helpUri`` only when ``docs_url`` says where that
    site is published."""
    rules = []
    for rule in RULES.values():
        markdown = rule_help(rule)
        entry: dict[str, Any] = {
            "id": rule.id,
            "shortDescription": {"text": _plain(rule.refuses), "markdown": rule.refuses},
            "help": {"text": _plain(markdown), "markdown": markdown},
            "defaultConfiguration": {"level": "error" if rule.default == "deny" else "warning"},
            "properties": {"reportedAt": _plain(rule.reports)},
        }
        if docs_url:
            entry["helpUri"] = page_url(rule.page, docs_url)
        if rule.setting:
            entry["name"] = rule.key
            entry["properties"]["setting"] = rule.setting
        rules.append(entry)
    return rules


class Sarif(Writer):
    """SARIF 2.1.0: a result per violation, ``level`` error (denied) or warning, at the line and column of its
    field in its file, the field path in the message and as a logical location. Input problems are the
    invocation's notifications. Standard input has no file to point at: its results carry the logical location
    alone. Columns count characters (``columnKind`` unicodeCodePoints)."""

    def __init__(self, out: TextIO, fail_on: str = "deny", docs_url: str = ""):
        super().__init__(out, fail_on)
        self.rules = sarif_rules(docs_url)
        self.index = {rule["id"]: i for i, rule in enumerate(self.rules)}
        self.results: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []

    def problem(self, source: str, problem: str, line: int = 0, column: int = 0) -> None:
        self._notify("error", source, problem, line, column)

    def _notify(self, level: str, source: str, text: str, line: int, column: int) -> None:
        where = f"{source}:{line}:{column}" if line else source
        notification: dict[str, Any] = {"level": level, "message": {"text": f"{where}: {text}"}}
        if source != STDIN:
            physical: dict[str, Any] = {"artifactLocation": {"uri": artifact_uri(source)}}
            if line:
                physical["region"] = {"startLine": line, **({"startColumn": column} if column else {})}
            notification["locations"] = [{"physicalLocation": physical}]
        self.notifications.append(notification)

    def object(self, source: str, checked: Checked) -> None:
        if checked.policy:
            self._notify("note", source, f"{checked.label}: {checked.note}", checked.line, checked.column)
        self.results.extend(self._result(f) for f in checked.findings)

    def finish(self, tally: Tally, status: int) -> None:
        run = {
            "tool": {"driver": {"name": "gpu-webhook", "version": __version__, "rules": self.rules}},
            "invocations": [{"executionSuccessful": status != EXIT_UNREADABLE, "exitCode": status,
                             "toolExecutionNotifications": self.notifications}],
            "columnKind": "unicodeCodePoints",
            "results": self.results,
        }
        document = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
        self.out.write(json.dumps(document, indent=2) + "\n")

    def _result(self, finding: Finding) -> dict[str, Any]:
        location: dict[str, Any] = {
            "logicalLocations": [{"name": finding.path, "fullyQualifiedName": f"{finding.object}: {finding.path}",
                                  "kind": "member"}],
        }
        if finding.file != STDIN:
            region = {"startLine": max(1, finding.line)}
            if finding.column > 0:
                region["startColumn"] = finding.column
            location["physicalLocation"] = {"artifactLocation": {"uri": artifact_uri(finding.file)}, "region": region}
        result: dict[str, Any] = {
            "ruleId": finding.rule,
            "level": "error" if finding.action == "deny" else "warning",
            "message": {"text": f"{finding.object}: {finding.path}: {finding.message}"},
            "locations": [location],
        }
        if finding.rule in self.index:
            result["ruleIndex"] = self.index[finding.rule]
        return result


WRITERS: dict[str, type[Writer]] = {"text": Text, "jsonl": JsonLines, "json": JsonDocument, "junit": JUnit,
                                    "sarif": Sarif}


def writer(output: str, out: TextIO, fail_on: str = "deny", docs_url: str = "") -> Writer:
    """The writer of ``output``; ``docs_url``, where the documentation site is published, links SARIF's rules."""
    if output == "sarif":
        return Sarif(out, fail_on, docs_url)
    return WRITERS[output](out, fail_on)
