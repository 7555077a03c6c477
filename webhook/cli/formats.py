"""What ``gpu-webhook check`` found, written for a person or for a CI system.

``text`` is one line per violation; ``jsonl`` one JSON object per violation and line; ``json`` one JSON
document with every violation, the input problems and a summary; ``junit`` JUnit XML as Jenkins and GitLab
read it (one testsuite per input file, one testcase per object, a ``<failure>`` per violation that fails the
run); ``sarif`` SARIF 2.1.0 as code scanning reads it (the rule table as ``tool.driver.rules``, each result at
its file and the first line of its document).

A violation fails the run when it is denied, or with ``--fail-on warning`` when it is only warned about; the
JUnit report makes failures of exactly those, so the report and the exit code agree. The XML is written with
the standard library's ElementTree: five element kinds do not call for a dependency in the image.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, TextIO
from urllib.parse import quote

from webhook import __version__
from webhook.core.catalog import RULES

OUTPUTS = ("text", "json", "jsonl", "junit", "sarif")
FAIL_ON = ("deny", "warning")
EXIT_CLEAN, EXIT_FINDINGS, EXIT_UNREADABLE = 0, 1, 2
STDIN = "<stdin>"
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
    line: int = 1  # the file's line where the object's document starts

    @property
    def object(self) -> str:
        return object_label(self.kind, self.namespace, self.name)

    def text(self) -> str:
        note = "" if self.action == "deny" else "warning: "
        return f"{self.file}: {self.object}: {self.path}: {note}{self.message}"

    def record(self) -> dict[str, str]:
        """The ``-o jsonl`` object (what ``-o json`` wrote one per line before it was one document)."""
        return {"file": self.file, "kind": self.kind, "name": self.name, "namespace": self.namespace,
                "path": self.path, "rule": self.rule, "action": self.action, "message": self.message}


def object_label(kind: str, namespace: str, name: str) -> str:
    """``Pod team-a/trainer``: the kind, then the name as Kubernetes writes a namespaced one (namespace/name)."""
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


@dataclass(frozen=True)
class Checked:
    """One object and what was found in it."""

    kind: str
    name: str
    namespace: str
    line: int
    findings: tuple[Finding, ...] = ()

    @property
    def label(self) -> str:
        return object_label(self.kind, self.namespace, self.name)


@dataclass
class FileReport:
    """One input file: the objects checked in it and, one line each, what could not be read."""

    source: str
    problems: list[str] = field(default_factory=list)
    objects: list[Checked] = field(default_factory=list)


@dataclass
class Tally:
    """Objects checked, denied (one denial or more) and warned (one warning or more: an object can be both),
    the violations by action, and the input problems."""

    objects: int = 0
    denied: int = 0
    warned: int = 0
    denials: int = 0
    warnings: int = 0
    problems: int = 0

    def add(self, checked: Checked) -> None:
        self.objects += 1
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
        return {"objects": self.objects, "denied": self.denied, "warned": self.warned, "denials": self.denials,
                "warnings": self.warnings, "problems": self.problems}

    def __str__(self) -> str:
        objects = f"{self.objects} object{'' if self.objects == 1 else 's'}"
        return f"{objects} checked, {self.denied} denied, {self.warned} warned"


def fails(finding: Finding, fail_on: str) -> bool:
    return finding.action == "deny" or fail_on == "warning"


class Writer:
    """Writes the reports of the files one by one (``add``), then what needs all of them (``finish``)."""

    def __init__(self, out: TextIO, fail_on: str = "deny"):
        self.out = out
        self.fail_on = fail_on
        self.reports: list[FileReport] = []

    def add(self, report: FileReport) -> None:
        self.reports.append(report)

    def finish(self, tally: Tally, status: int) -> None:
        pass


class Text(Writer):
    def add(self, report: FileReport) -> None:
        for checked in report.objects:
            for finding in checked.findings:
                print(finding.text(), file=self.out)


class JsonLines(Writer):
    def add(self, report: FileReport) -> None:
        for checked in report.objects:
            for finding in checked.findings:
                print(json.dumps(finding.record()), file=self.out)


class JsonDocument(Writer):
    def finish(self, tally: Tally, status: int) -> None:
        document = {
            "findings": [{**f.record(), "line": f.line} for r in self.reports for c in r.objects for f in c.findings],
            "problems": [{"file": r.source, "problem": p} for r in self.reports for p in r.problems],
            "summary": {**tally.summary(), "failOn": self.fail_on, "exitCode": status},
        }
        self.out.write(json.dumps(document, indent=2) + "\n")


# XML 1.0 has no way to write most control characters, not even escaped: they are shown as \xNN instead.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class JUnit(Writer):
    """JUnit XML: a testsuite per file, a testcase per object (``Pod team-a/trainer``) and per input problem
    (an ``<error>``), a ``<failure>`` per violation that fails the run (its ``type`` the rule id, its
    ``message`` the field path and message); warnings that do not fail the run go to the testcase's
    ``<system-out>``."""

    def finish(self, tally: Tally, status: int) -> None:
        root = ET.Element("testsuites", name="gpu-webhook check")
        totals = {"tests": 0, "failures": 0, "errors": 0}
        for report in self.reports:
            suite = ET.SubElement(root, "testsuite", name=xml_text(report.source), file=xml_text(report.source))
            counts = {"tests": 0, "failures": 0, "errors": 0}
            for problem in report.problems:
                case = ET.SubElement(suite, "testcase", name=xml_text(problem), classname=xml_text(report.source))
                error = ET.SubElement(case, "error", type="unreadable-input", message=xml_text(problem))
                error.text = xml_text(f"{report.source}: {problem}")
                counts["tests"] += 1
                counts["errors"] += 1
            for checked in report.objects:
                case = ET.SubElement(suite, "testcase", name=xml_text(checked.label), classname=xml_text(report.source))
                counts["tests"] += 1
                notes = []
                for finding in checked.findings:
                    if fails(finding, self.fail_on):
                        failure = ET.SubElement(case, "failure", type=finding.rule,
                                                message=xml_text(f"{finding.path}: {finding.message}"))
                        failure.text = xml_text(
                            f"{finding.action} ({finding.rule}) at {finding.path}\n{finding.message}\n"
                            f"{finding.file}, line {finding.line}"
                        )
                    else:
                        notes.append(f"warning ({finding.rule}) at {finding.path}: {finding.message}")
                if any(fails(f, self.fail_on) for f in checked.findings):
                    counts["failures"] += 1
                if notes:
                    ET.SubElement(case, "system-out").text = xml_text("\n".join(notes))
            for key, value in counts.items():
                suite.set(key, str(value))
                totals[key] += value
        for key, value in totals.items():
            root.set(key, str(value))
        ET.indent(root)
        self.out.write('<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n")


def artifact_uri(source: str) -> str:
    """A file as a SARIF ``uri``: relative paths stay relative (code scanning resolves them from the checkout),
    absolute ones become ``file://`` URIs; both percent-encoded."""
    path = PurePath(source)
    if path.is_absolute():
        return "file://" + quote(path.as_posix())
    return quote(path.as_posix())


def _plain(markdown: str) -> str:
    return markdown.replace("`", "")


def sarif_rules() -> list[dict[str, Any]]:
    """``tool.driver.rules``: every rule of the table, its default action as the level, its page as help."""
    rules = []
    for rule in RULES.values():
        entry: dict[str, Any] = {
            "id": rule.id,
            "shortDescription": {"text": _plain(rule.refuses), "markdown": rule.refuses},
            "help": {"text": f"docs/{rule.page}", "markdown": f"[docs/{rule.page}](docs/{rule.page})"},
            "defaultConfiguration": {"level": "error" if rule.default == "deny" else "warning"},
            "properties": {"reportedAt": _plain(rule.reports)},
        }
        if rule.setting:
            entry["name"] = rule.key
            entry["properties"]["setting"] = rule.setting
        rules.append(entry)
    return rules


class Sarif(Writer):
    """SARIF 2.1.0: a result per violation, ``level`` error (denied) or warning, at its file and the first line
    of its object's document, the field path in the message and as a logical location. Input problems are
    the invocation's notifications. Standard input has no file to point at: its results carry the logical
    location alone."""

    def finish(self, tally: Tally, status: int) -> None:
        rules = sarif_rules()
        index = {rule["id"]: i for i, rule in enumerate(rules)}
        results: list[dict[str, Any]] = []
        notifications: list[dict[str, Any]] = []
        for report in self.reports:
            for problem in report.problems:
                notification: dict[str, Any] = {"level": "error", "message": {"text": f"{report.source}: {problem}"}}
                if report.source != STDIN:
                    notification["locations"] = [
                        {"physicalLocation": {"artifactLocation": {"uri": artifact_uri(report.source)}}}
                    ]
                notifications.append(notification)
            for checked in report.objects:
                results.extend(self._result(f, index) for f in checked.findings)
        run = {
            "tool": {"driver": {"name": "gpu-webhook", "version": __version__, "rules": rules}},
            "invocations": [{"executionSuccessful": status != EXIT_UNREADABLE, "exitCode": status,
                             "toolExecutionNotifications": notifications}],
            "results": results,
        }
        document = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
        self.out.write(json.dumps(document, indent=2) + "\n")

    def _result(self, finding: Finding, index: dict[str, int]) -> dict[str, Any]:
        location: dict[str, Any] = {
            "logicalLocations": [{"name": finding.path, "fullyQualifiedName": f"{finding.object}: {finding.path}",
                                  "kind": "member"}],
        }
        if finding.file != STDIN:
            location["physicalLocation"] = {
                "artifactLocation": {"uri": artifact_uri(finding.file)},
                "region": {"startLine": max(1, finding.line)},
            }
        result: dict[str, Any] = {
            "ruleId": finding.rule,
            "level": "error" if finding.action == "deny" else "warning",
            "message": {"text": f"{finding.object}: {finding.path}: {finding.message}"},
            "locations": [location],
        }
        if finding.rule in index:
            result["ruleIndex"] = index[finding.rule]
        return result


WRITERS: dict[str, type[Writer]] = {"text": Text, "jsonl": JsonLines, "json": JsonDocument, "junit": JUnit,
                                    "sarif": Sarif}


def writer(output: str, out: TextIO, fail_on: str = "deny") -> Writer:
    return WRITERS[output](out, fail_on)
