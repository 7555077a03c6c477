"""The Dockerfile itself, read as text: no image is needed, so these run everywhere.

- One Dockerfile serves `docker build` (classic builder or BuildKit) and `buildah bud`: it may use nothing that
  only one of them takes. Only buildah runs here (tests/image/build-image.sh); this is what stands in for the
  Docker side.
- The image's default command must be reachable through a published port (`docker run -p 8443:8443`): inside
  a container, 127.0.0.1 is the container's own loopback, where no published port arrives.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex

import pytest

from tests.tools import ROOT
from webhook.cli.main import _parser

DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments and blank lines dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, f"the Dockerfile ends inside an instruction: {pending!r}"
    return out


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    assert starts, "no FROM"
    return steps[starts[-1]:]


def exec_form(stage: list[tuple[str, str]], word: str) -> list[str]:
    """The last ENTRYPOINT or CMD of the stage, which must be in exec (JSON) form."""
    found = [rest for w, rest in stage if w == word]
    assert found, f"no {word} in the final stage"
    value = json.loads(found[-1])
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"{word} is not in exec form"
    return value


STEPS = instructions(DOCKERFILE.read_text(encoding="utf-8"))


def test_the_parser_reads_the_dockerfile() -> None:
    """A control for the tests below: the parser sees both stages and the instructions they rely on."""
    words = [word for word, _ in STEPS]
    assert words.count("FROM") == 2
    assert {"ARG", "RUN", "COPY", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD"} <= set(words)
    # A continued RUN is one instruction: the builder's cleanup ends with the version check.
    assert any(w == "RUN" and "pip uninstall" in rest and rest.endswith("--version") for w, rest in STEPS)


def default_host(command: list[str]) -> str | None:
    """The address `gpu-webhook <command>` listens on when it is `serve` and names one (--host)."""
    args = _parser().parse_args(command)
    assert args.command == "serve", command
    return args.host


def test_default_command_listens_on_every_interface() -> None:
    stage = final_stage(STEPS)
    assert exec_form(stage, "ENTRYPOINT") == ["gpu-webhook"]
    command = exec_form(stage, "CMD")
    host = default_host(command)
    assert host is not None, (
        f"CMD {command} names no --host: `serve --self-signed` then binds 127.0.0.1, the container's own "
        "loopback, which `docker run -p 8443:8443` cannot reach"
    )
    assert ipaddress.ip_address(host).is_unspecified, f"CMD listens on {host} only"
    assert "8443/tcp" in {f"{p}/tcp" if "/" not in p else p for w, rest in stage if w == "EXPOSE" for p in rest.split()}


@pytest.mark.parametrize(
    ("command", "reachable"),
    [
        (["serve", "--self-signed"], False),  # the CLI's own default with --self-signed: 127.0.0.1
        (["serve", "--self-signed", "--host", "127.0.0.1"], False),
        (["serve", "--self-signed", "--host", "0.0.0.0"], True),
        (["serve", "--self-signed", "--host", "::"], True),
    ],
)
def test_the_host_check_tells_loopback_from_every_interface(command: list[str], reachable: bool) -> None:
    """A control: the check above fails on the old default and on an explicit loopback address."""
    host = default_host(command)
    assert (host is not None and ipaddress.ip_address(host).is_unspecified) is reachable


# What one of the builders lacks: syntax that Docker's classic builder refuses or ignores (BuildKit's
# extensions), or that the buildah verified here (1.28) does not take.
NOT_PORTABLE = [
    (re.compile(r"^#\s*syntax\s*=", re.IGNORECASE | re.MULTILINE), "a `# syntax=` frontend directive"),
    (re.compile(r"^\s*RUN\s+--(mount|network|security)\b", re.IGNORECASE | re.MULTILINE),
     "RUN --mount/--network/--security (BuildKit only)"),
    (re.compile(r"^\s*(COPY|ADD)\s+(--\S+\s+)*--(link|chmod|parents|exclude|checksum|keep-git-dir)\b",
                re.IGNORECASE | re.MULTILINE), "COPY/ADD flags the classic builder lacks"),
    (re.compile(r"^\s*(RUN|COPY|ADD)\b[^\n]*<<-?\s*[\"']?[A-Za-z_]", re.IGNORECASE | re.MULTILINE),
     "a heredoc (BuildKit only among Docker's builders)"),
    (re.compile(r"\$\{?(BUILDPLATFORM|BUILDOS|BUILDARCH|TARGETPLATFORM|TARGETOS|TARGETARCH|TARGETVARIANT)\b"),
     "an automatic platform ARG (empty in Docker's classic builder)"),
    (re.compile(r"^\s*FROM\s+--platform", re.IGNORECASE | re.MULTILINE), "FROM --platform"),
]


def portability_problems(text: str) -> list[str]:
    return [what for pattern, what in NOT_PORTABLE if pattern.search(text)]


def test_dockerfile_uses_only_what_every_builder_takes() -> None:
    assert portability_problems(DOCKERFILE.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "line",
    [
        "# syntax=docker/dockerfile:1",
        "RUN --mount=type=cache,target=/root/.cache pip install x",
        "COPY --chmod=0755 run.sh /",
        "COPY --from=builder --link /opt /opt",
        "RUN <<EOF\necho hi\nEOF",
        "FROM --platform=$BUILDPLATFORM python AS b",
        'RUN echo "${TARGETARCH}"',
    ],
)
def test_the_portability_check_catches_builder_specific_syntax(line: str) -> None:
    """A control: each pattern fires on the construct it names."""
    assert portability_problems(f"FROM scratch\n{line}\n")


def test_every_stage_is_from_the_base_argument() -> None:
    """Both stages FROM ${BASE}: the venv made in the builder finds the same interpreter at run time. An ARG
    before the first FROM is the only kind every builder expands in FROM."""
    first_from = next(i for i, (w, _) in enumerate(STEPS) if w == "FROM")
    assert any(w == "ARG" and rest.startswith("BASE=") for w, rest in STEPS[:first_from])
    froms = [shlex.split(rest)[0] for w, rest in STEPS if w == "FROM"]
    assert froms == ["${BASE}", "${BASE}"]
