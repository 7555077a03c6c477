"""Blocks of the documentation that are generated from their source.

A page marks a generated block with two HTML comments::

    <!-- BEGIN GENERATED: cli -->
    ...
    <!-- END GENERATED: cli -->

``python -m docs.gen`` rewrites every block of every page under ``docs/`` with what ``BLOCKS[name]()``
returns; ``python -m docs.gen --check`` only reports the blocks that differ (``tests/test_docs.py`` runs the
same check). To add a block, write a function that returns its Markdown, register it in ``BLOCKS`` under a
name, put the two markers where it belongs and run ``python -m docs.gen``.

A block whose name is in ``PENDING`` is hand-written for now: the generator leaves it alone.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REGENERATE = "python -m docs.gen"

BEGIN = re.compile(r"^<!-- BEGIN GENERATED: (?P<name>[a-z0-9-]+) -->\n", re.MULTILINE)
END = "<!-- END GENERATED: {name} -->"
_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")


# --- blocks copied from other files of the repository -------------------------------------------------------

# Files that are copied into a page, and that page: a link to one of them, from any copied file, goes to its
# page. README.md is the site's home page.
COPIES = {
    "README.md": "index.md",
    "charts/gpu-webhook/README.md": "chart.md",
    "certs/README.md": "certificates.md",
    "tests/hardening/README.md": "hardening.md",
}


def _outside_code(line: str, change: Callable[[str], str]) -> str:
    """``change`` applied to the parts of one Markdown line that are not code spans."""
    out, last = [], 0
    for span in _CODE_SPAN.finditer(line):
        out.append(change(line[last : span.start()]))
        out.append(span.group(0))
        last = span.end()
    out.append(change(line[last:]))
    return "".join(out)


def _retarget(source: str, page: str, text: str) -> str:
    """The links of ``text``, copied from repository file ``source`` into docs page ``page``, made to work there.

    A link to a page of the site, or to a file copied into one, points at that page; a link within the file
    stays; a link to any other file of the repository becomes its path in code, since the site holds only
    ``docs/``. Links to other sites stay as they are.
    """
    here = posixpath.dirname(source)

    def one(match: re.Match[str]) -> str:
        bang, label, target = match.group("bang", "text", "target")
        if target.startswith("#") or re.match(r"^[a-z][a-z0-9+.-]*:", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(here, path)) if path else source
        page_path = COPIES.get(repo_path)
        if page_path is None and repo_path.startswith("docs/") and repo_path.endswith(".md"):
            page_path = repo_path.removeprefix("docs/")
        if page_path is not None:
            if page_path == page:
                return f"{bang}[{label}](#{anchor})" if anchor else label
            link = posixpath.relpath(page_path, posixpath.dirname(page) or ".")
            return f"{bang}[{label}]({link}{'#' + anchor if anchor else ''})"
        shown = repo_path + ("/" if path.endswith("/") else "")
        if label.strip("`") in (shown, path, posixpath.basename(shown.rstrip("/"))):
            return f"`{shown}`"
        return f"{label} (`{shown}`)"

    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        out.append(line if fenced else _outside_code(line, lambda part: _LINK.sub(one, part)))
    return "".join(out)


def copy_of(source: str, *, keep_title: bool = False) -> Callable[[], str]:
    """A block holding repository file ``source`` (its links retargeted), without its title unless asked."""

    def block() -> str:
        text = (ROOT / source).read_text(encoding="utf-8")
        if not keep_title:
            text = re.sub(r"\A# [^\n]*\n+", "", text)
        note = f"<!-- A copy of {source}, made by `{REGENERATE}`: edit that file, not this block. -->\n\n"
        return note + _retarget(source, COPIES[source], text)

    block.__doc__ = f"A copy of {source}, its links made to work in {COPIES[source]}."
    return block


# --- the command line ---------------------------------------------------------------------------------------

# Where the parser of `gpu-webhook` may be built: the first of these functions found in webhook.cli or its
# submodules, so that moving it within the package needs no change here.
_PARSER_BUILDERS = ("build_parser", "make_parser", "parser", "_parser", "_build_parser")


def find_parser() -> argparse.ArgumentParser:
    """The ``gpu-webhook`` argument parser, from the function in ``webhook.cli`` that builds it."""
    package = importlib.import_module("webhook.cli")
    modules = [package]
    if hasattr(package, "__path__"):
        names = [f"{package.__name__}.{info.name}" for info in pkgutil.iter_modules(package.__path__)]
        modules += [importlib.import_module(name) for name in names]
    for module in modules:
        for name in _PARSER_BUILDERS:
            builder = getattr(module, name, None)
            if callable(builder) and not isinstance(builder, type):
                try:
                    parser = builder()
                except TypeError:
                    continue
                if isinstance(parser, argparse.ArgumentParser) and any(_subcommands(parser)):
                    return parser
    raise LookupError(f"no function {', '.join(_PARSER_BUILDERS)} in webhook.cli builds the parser of the commands")


def _escape(text: str) -> str:
    """Plain text for a Markdown table cell: no HTML tags, emphasis or cell breaks, code spans kept."""
    def plain(part: str) -> str:
        return part.replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*").replace("|", r"\|")

    return _outside_code(text.replace("\n", " "), plain)


def _metavar(action: argparse.Action) -> str:
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    if action.metavar is not None:
        return str(action.metavar)
    return action.dest.upper() if action.option_strings else action.dest


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _usage_part(action: argparse.Action) -> str:
    if not action.option_strings:
        meta = _metavar(action)
        return {"+": f"{meta}...", "*": f"[{meta}...]", "?": f"[{meta}]"}.get(str(action.nargs), meta)
    flag = max(action.option_strings, key=len)
    part = f"{flag} {_metavar(action)}" if _takes_value(action) else flag
    if isinstance(action, argparse._AppendAction):
        part += " ..."
    return part if action.required else f"[{part}]"


def _default(action: argparse.Action) -> str:
    default = action.default
    if not _takes_value(action) or default in (None, argparse.SUPPRESS) or default == [] or default is False:
        return ""
    return f"`{default}`"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        try:
            text = text % {**vars(action), "prog": prog, "default": action.default}
        except (KeyError, TypeError, ValueError):
            pass
    return _escape(text)


def _visible(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS]


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield name, helps.get(name, ""), sub


def _wrapped(parts: list[str], width: int = 100) -> list[str]:
    """A usage line cut between its parts at ``width``, continued under the first option."""
    indent = " " * (len(parts[0]) + 1)
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + 1 + len(part) > width and lines[-1] != parts[0]:
            lines.append(indent + part)
        else:
            lines[-1] += " " + part
    return lines


def cli_reference() -> str:
    """Usage and an options table for every subcommand of ``gpu-webhook``, from its argparse parser."""
    parser = find_parser()
    prog = parser.prog
    lines = [
        f"<!-- Made by `{REGENERATE}` from the argument parser of `{prog}`: edit the parser, not this block. -->",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    commands = list(_subcommands(parser))
    for name, summary, _ in commands:
        lines.append(f"| [`{prog} {name}`](#{prog}-{name}) | {_escape(summary)} |")
    top = [a for a in _visible(parser) if a.option_strings]
    if top:
        lines += ["", "Without a command: " + ", ".join(f"`{max(a.option_strings, key=len)}`" for a in top)
                  + " (" + "; ".join(_help(a, prog) for a in top) + ")."]
    lines += _exit_codes(parser)
    for name, _, sub in commands:
        actions = _visible(sub)
        lines += ["", f"### `{prog} {name}`", "", "```text", *_wrapped([f"{prog} {name}", *map(_usage_part, actions)]),
                  "```", "", "| option | default | what it does |", "|---|---|---|"]
        for action in actions:
            if action.option_strings:
                flags = ", ".join(f"`{flag}`" for flag in action.option_strings)
                if _takes_value(action):
                    flags += f" `{_metavar(action)}`"
            else:
                flags = f"`{_usage_part(action)}`"
            lines.append(f"| {flags} | {_default(action)} | {_help(action, prog)} |")
        lines += _exit_codes(sub)
    return "\n".join(lines) + "\n"


_EXIT_CODE = re.compile(r"^ +(?P<code>\d+) +(?P<meaning>.+)$")


def _exit_codes(parser: argparse.ArgumentParser) -> list[str]:
    """The exit codes a parser's epilog lists (``exit codes:`` then ``  CODE  meaning`` lines), as a list."""
    epilog = parser.epilog or ""
    found = [m for line in epilog.splitlines() if (m := _EXIT_CODE.match(line))]
    if not epilog.startswith("exit codes:") or not found:
        return []
    return ["", "Exit codes:", "", *(f"- `{m['code']}`: {_escape(m['meaning'])}" for m in found)]


# --- chart values -------------------------------------------------------------------------------------------

VALUES = "charts/gpu-webhook/values.yaml"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")
_DESCRIPTION = re.compile(r"^ *# -- ?(?P<text>.*)$")
_MORE = re.compile(r"^ *#(?: (?P<text>.*))?$")


@dataclass
class Value:
    path: str
    description: str
    default: Any


def _lookup(tree: Any, parts: list[str]) -> Any:
    for part in parts:
        tree = tree[part]
    return tree


def chart_values_of(text: str) -> list[Value]:
    """Every key of a values.yaml that has a ``# --`` description, in file order.

    The description is the ``# --`` line and the comment lines that follow it, up to the first one indented
    further (an example, which stays in values.yaml).
    """
    tree = yaml.safe_load(text)
    found: list[Value] = []
    stack: list[tuple[int, str]] = []
    words: list[str] | None = None
    example = False
    for line in text.splitlines():
        if (start := _DESCRIPTION.match(line)) is not None:
            words, example = [start.group("text").strip()], False
            continue
        if words is not None and (more := _MORE.match(line)) is not None:
            rest = more.group("text") or ""
            example = example or rest.startswith(" ")
            if not example:
                words.append(rest.strip())
            continue
        if (key := _KEY.match(line)) is None:
            continue
        indent = len(key.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key.group("key")))
        if words is not None:
            parts = [name for _, name in stack]
            description = " ".join(word for word in words if word)
            if example:
                description += f" (The comment in `{VALUES}` goes on with an example.)"
            found.append(Value(".".join(parts), description, _lookup(tree, parts)))
            words = None
    return found


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if len(text) > 60:
        kind = "mapping" if isinstance(value, dict) else "list"
        return f"a {kind}, see `{VALUES}`"
    return f"`{text}`"


def chart_values() -> str:
    """A table of the chart's values: key, default and the description from its comment in values.yaml."""
    lines = [
        f"<!-- Made by `{REGENERATE}` from the comments of {VALUES}: edit that file, not this block. -->",
        "",
        "| key | default | description |",
        "|---|---|---|",
    ]
    for value in chart_values_of((ROOT / VALUES).read_text(encoding="utf-8")):
        lines.append(f"| `{value.path}` | {_shown(value.default)} | {_escape(value.description)} |")
    return "\n".join(lines) + "\n"


# --- the rule table ---------------------------------------------------------------------------------------


_PAGE_TITLES = {
    "rules.md": "Rules and policy", "pod-mistakes.md": "Pods that can never run", "isolation.md": "GPU isolation",
    "dra.md": "DRA",
}


def rules_table() -> str:
    """Every rule with a setting of its own, from the rule table: key, id, default, what, engine, page."""
    from webhook.core import catalog

    lines = [
        "| policy key | rule id | default | refused or warned | engine | described in |",
        "|---|---|---|---|---|---|",
    ]
    for section in catalog.SECTIONS:
        for rule in catalog.in_section(section):
            page = rule.page.split("#", 1)[0]
            engine = "native + webhook" if rule.engine == "native" else "webhook"
            refuses = rule.refuses
            if rule.tenant:
                # a tenant rule (docs/isolation.md): its denial of a pod that asks for no GPU holds in a tenant
                # namespace only
                refuses += "; on a pod that asks for no GPU, a denial is a warning outside `isolation.tenantNamespaces`"
            lines.append(f"| `{rule.setting}` | `{rule.id}` | {rule.default} | {refuses} | {engine} | "
                         f"[{_PAGE_TITLES.get(page, page)}]({rule.page}) |")
    return "\n".join(lines) + "\n"


def engines_table() -> str:
    """Every rule and the engine that decides it, with why a rule stays with the webhook."""
    from webhook.core import catalog

    lines = ["| rule id | setting | engine | why the webhook |", "|---|---|---|---|"]
    for rule in catalog.RULES.values():
        setting = f"`{rule.setting}`" if rule.setting else "follows `enforcement`"
        engine = "native policy and webhook" if rule.engine == "native" else "webhook only"
        lines.append(f"| `{rule.id}` | {setting} | {engine} | {rule.why or '–'} |")
    return "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    """A scalar or a list as YAML on one line: ``[a, b]``, ``"off"``, ``""``, ``false``."""
    if isinstance(value, str):
        plain = yaml.safe_dump(value, default_style=None).removesuffix("\n...\n").strip()
        return plain if plain == value else json.dumps(value)
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).removesuffix("...\n").strip()


def _defaults_yaml(mapping: Any, indent: str = "", prefix: str = "") -> list[str]:
    """The built-in defaults as YAML: mappings as blocks, each rule's setting with its rule id in a comment, a
    list too long for one line as a block."""
    from webhook.core import catalog

    ids = {rule.setting: rule.id for rule in catalog.RULES.values() if rule.setting}
    lines = []
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            lines += [f"{indent}{key}:", *_defaults_yaml(value, indent + "  ", f"{path}.")]
            continue
        line = f"{indent}{key}: {_flow(value)}"
        if isinstance(value, list) and len(line) > 100:
            lines += [f"{indent}{key}:", *(f"{indent}  - {_flow(item)}" for item in value)]
            continue
        lines.append(f"{line:<40}  # {ids[path]}" if path in ids else line)
    return lines


def policy_reference() -> str:
    """The built-in defaults as a policy file, then every key with its default and what it does: the words of
    ``webhook.core.policykeys``, which the CRD's descriptions (``kubectl explain``) carry too."""
    from webhook.core import catalog, policykeys
    from webhook.core.policyschema import DEFAULTS

    settings = {rule.setting for rule in catalog.RULES.values() if rule.setting}
    lines = [
        f"<!-- Made by `{REGENERATE}` from webhook.core.policykeys, the words the CRD's descriptions carry too: edit "
        "that module, not this block. -->",
        "",
        '```yaml title="the defaults"',
        *_defaults_yaml(DEFAULTS),
        "```",
        "",
        "| key | default | what it does |",
        "|---|---|---|",
    ]
    for path in policykeys.key_paths():
        if path in settings or path.startswith(policykeys.IN_NAMESPACE):
            continue
        words = policykeys.what(path) or ""
        if path in catalog.SECTIONS:
            words += " Each rule's key, id and default: [Every rule](#every-rule)."
        value = policykeys.default(path)
        default = "–" if value is None else f"`{policykeys.shown(value)}`"
        lines.append(f"| `{path}` | {default} | {_escape(words)} |")
    return "\n".join(lines) + "\n"


def versions_table() -> str:
    """For the default policy: what each Kubernetes version serves, the engine of each half, what it leaves to the
    webhook (``gpu-webhook admission-policies --versions``)."""
    from webhook.core.policyfile import parse_policy
    from webhook.native.generate import versions_table as table

    return table(parse_policy("{}"))


def _names(values: list[str] | tuple[str, ...]) -> str:
    return ", ".join(f"`{v}`" for v in values) if values else "none"


def defaults_table() -> str:
    """The defaults a platform engineer meets on day one, read from the code: the namespaces each engine leaves
    alone or trusts (the policy's DEFAULTS), how the native policies read the policy, and the Kubernetes versions
    (the generator's range, the chart's kubeVersion)."""
    from webhook.core.policyschema import DEFAULTS
    from webhook.native import target

    isolation = DEFAULTS["isolation"]
    native = DEFAULTS["nativePolicies"]
    rows = [
        ("`excludeNamespaces`", "namespaces no engine looks at (the chart's webhooks, the native policies, "
         "`check`)", _names(DEFAULTS["excludeNamespaces"])),
        ("`nativePolicies.excludeNamespaces`", "namespaces the native policies also leave alone",
         _names(native["excludeNamespaces"])),
        ("`webhook.excludeNamespaces` (chart value)", "namespaces the chart's webhooks also leave alone, besides "
         "the release's own namespace", _names(_lookup(yaml.safe_load((ROOT / VALUES).read_text(
             encoding="utf-8")), ["webhook", "excludeNamespaces"]))),
        ("`isolation.platformNamespaces`", "namespaces the isolation rules trust as the platform's",
         _names(isolation["platformNamespaces"])),
        ("`isolation.trusted.namespaces`", "more namespaces the isolation rules trust", _names(
            isolation["trusted"]["namespaces"])),
        ("`isolation.trusted.serviceAccounts`", "service accounts the isolation rules trust",
         _names(isolation["trusted"]["serviceAccounts"])),
    ]
    if "tenantNamespaces" in isolation:
        rows.append(("`isolation.tenantNamespaces`", "namespaces where the rules about pods without GPUs deny "
                     "instead of warn", _names(isolation["tenantNamespaces"])))
    if "nvidiaRuntime" in isolation:
        rows.append(("`isolation.nvidiaRuntime`", "when the NVIDIA runtime reads `NVIDIA_VISIBLE_DEVICES`",
                     f"`{isolation['nvidiaRuntime']}`"))
    chart = yaml.safe_load((ROOT / "charts" / "gpu-webhook" / "Chart.yaml").read_text(encoding="utf-8"))

    def first(version: str) -> int:
        return min(m for m in range(target.OLDEST, target.NEWEST + 1) if target._could_serve(m, version))
    rows += [
        ("`nativePolicies.params`", "how the native policies read GPUPolicy/default", f"`{native['params']}`"),
        ("Kubernetes (chart)", "the chart's `kubeVersion`", f"`{chart['kubeVersion']}`"),
        ("Kubernetes (native policies)", "the versions `admission-policies` generates for; newer ones get the "
         "newest's policies", f"1.{target.OLDEST} to 1.{target.NEWEST}"),
        ("MutatingAdmissionPolicy", "where the mutation is native (elsewhere the webhook keeps it)",
         f"`v1` from 1.{first('v1')}; `v1beta1` from 1.{first('v1beta1')} when the cluster turns it on"),
    ]
    lines = ["| key | what | default |", "|---|---|---|"]
    lines += [f"| {key} | {what} | {value} |" for key, what, value in rows]
    return "\n".join(lines) + "\n"


# --- the registry -------------------------------------------------------------------------------------------

BLOCKS: dict[str, Callable[[], str]] = {
    "readme": copy_of("README.md", keep_title=True),
    "cli": cli_reference,
    "chart-values": chart_values,
    "chart-readme": copy_of("charts/gpu-webhook/README.md"),
    "certs-readme": copy_of("certs/README.md"),
    "hardening-readme": copy_of("tests/hardening/README.md"),
    "rules": rules_table,
    "rule-engines": engines_table,
    "policy-reference": policy_reference,
    "versions": versions_table,
    "defaults": defaults_table,
}

# Blocks that are still written by hand, and why (none now).
PENDING: dict[str, str] = {}


# --- pages --------------------------------------------------------------------------------------------------


@dataclass
class Block:
    name: str
    start: int  # where the block's content starts (after the BEGIN line)
    end: int  # where the END line starts


def blocks_of(text: str, where: str = "page") -> list[Block]:
    """The generated blocks of a page; ValueError when a BEGIN has no END or blocks nest."""
    found: list[Block] = []
    position = 0
    while (begin := BEGIN.search(text, position)) is not None:
        name = begin.group("name")
        end = text.find(END.format(name=name), begin.end())
        if end < 0:
            raise ValueError(f"{where}: <!-- BEGIN GENERATED: {name} --> has no {END.format(name=name)}")
        if (inner := BEGIN.search(text, begin.end(), end)) is not None:
            raise ValueError(f"{where}: block {inner.group('name')!r} starts inside block {name!r}")
        found.append(Block(name, begin.end(), end))
        position = end
    return found


def regenerate(text: str, where: str = "page", generated: dict[str, str] | None = None) -> str:
    """``text`` with each registered block's content replaced by what its generator returns now."""
    out, last = [], 0
    for block in blocks_of(text, where):
        if block.name in PENDING:
            continue
        if block.name not in BLOCKS:
            raise KeyError(f"{where}: no generator for block {block.name!r} (docs/gen: BLOCKS or PENDING)")
        if generated is not None and block.name in generated:
            content = generated[block.name]
        else:
            content = BLOCKS[block.name]()
            if generated is not None:
                generated[block.name] = content
        out += [text[last : block.start], content if content.endswith("\n") else content + "\n"]
        last = block.end
    out.append(text[last:])
    return "".join(out)


def pages() -> list[Path]:
    return sorted(path for path in DOCS.rglob("*.md") if "gen" not in path.relative_to(DOCS).parts)


def stale() -> list[str]:
    """The pages whose generated blocks differ from what the generators return now."""
    generated: dict[str, str] = {}
    out = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        where = str(page.relative_to(ROOT))
        if regenerate(text, where, generated) != text:
            names = [b.name for b in blocks_of(text, where) if b.name in BLOCKS]
            out.append(f"{where} ({', '.join(names)})")
    return out


def write() -> list[str]:
    """Rewrite every page's generated blocks; the pages that changed."""
    generated: dict[str, str] = {}
    changed = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = regenerate(text, str(page.relative_to(ROOT)), generated)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(str(page.relative_to(ROOT)))
    return changed
