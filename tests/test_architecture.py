"""docs/architecture.md is the truth: every module has a row, each row's imports are what the code imports,
and its layers are the import-linter contract's."""

from __future__ import annotations

import ast
import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "webhook"
DOC = ROOT / "docs" / "architecture.md"
_ROW = re.compile(r"^\| `(?P<module>[a-z_.]+)` \| (?P<job>.+) \| (?P<imports>[^|]+) \|$", re.MULTILINE)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """``core.policy`` -> its file, for every module below the package (packages by their ``__init__``)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts[-1] != "__main__":
            found[".".join(parts)] = path
    return found


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's own modules a file imports, at the top or inside functions (``from webhook.x import y``
    counts as ``x.y`` when that is a module, else as ``x``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "webhook":
            base = node.module.removeprefix("webhook").removeprefix(".")
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                out.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("webhook.") for a in node.names if a.name.startswith("webhook."))
    return out - {""}


def documented(text: str) -> dict[str, set[str]]:
    rows = {}
    for match in _ROW.finditer(text):
        cell = match["imports"].strip()
        rows[match["module"]] = set() if cell == "–" else set(re.findall(r"`([a-z_.]+)`", cell))
    return rows


def test_every_module_has_a_row_whose_imports_are_the_codes():
    known = modules()
    rows = documented(DOC.read_text(encoding="utf-8"))
    subpackages = {name for name, path in known.items() if path.name == "__init__.py"}
    assert set(known) - subpackages - set(rows) == set(), "modules without a row in docs/architecture.md"
    assert set(rows) - set(known) == set(), "rows for modules that do not exist"
    wrong = {
        module: {"doc": sorted(rows[module]), "code": sorted(imports_of(known[module], known) - {module})}
        for module in rows
        if rows[module] != imports_of(known[module], known) - {module}
    }
    assert wrong == {}


def test_the_check_fails_on_an_import_the_doc_does_not_list(tmp_path):
    package = tmp_path / "webhook"
    (package / "core").mkdir(parents=True)
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / "field.py").write_text("def f():\n    from webhook.serving import connections\n")
    (package / "serving").mkdir()
    (package / "serving" / "__init__.py").write_text("")
    (package / "serving" / "connections.py").write_text("")
    known = modules(package)
    assert imports_of(known["core.field"], known) == {"serving.connections"}
    assert documented("| `core.field` | paths | – |\n") == {"core.field": set()}


def test_the_layers_shown_are_the_contracts():
    contracts = configparser.ConfigParser()
    contracts.read(ROOT / ".importlinter", encoding="utf-8")
    layers = [line.strip() for line in contracts["importlinter:contract:layers"]["layers"].strip().splitlines()]
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- layers:", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    assert block.strip().splitlines() == layers


# A module a reader takes in whole: one job each (docs/architecture.md's row), none over this many lines.
MAX_LINES = 600


def test_no_module_is_over_the_length_a_reader_takes_in_whole():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by what they do (docs/architecture.md): {long}"


TEMPLATES = ROOT / "charts" / "gpu-webhook" / "templates"
_OPENING_COMMENT = re.compile(r"\A(\{\{-? ?/\*|# )\s*\S")


def test_every_module_and_template_opens_with_what_it_holds():
    """A reader opening a file learns its job first: a module's docstring, a template's leading comment (the
    generated ones name the command that writes them)."""
    bare = [str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py")
            if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))]
    bare += [path.name for path in sorted(TEMPLATES.iterdir())
             if not _OPENING_COMMENT.match(path.read_text(encoding="utf-8"))]
    assert bare == [], "open these with a line that says what they hold"
