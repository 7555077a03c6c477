"""The README's local and CI quick starts and its native-policies example, run as written: every ``$ command``
of their console blocks is run by bash from the repository's root and must print exactly the lines shown under
it. (The cluster quick start's dry run is the chart NOTES' one, held by tests/chart/test_chart.py and
tests/e2e/test_helm.py.)"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.server import GPU_WEBHOOK, WebhookProcess, free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def sessions(text: str) -> list[tuple[str, list[str]]]:
    """(command, the lines it prints) for each ``$ `` line of the console blocks in ``text``."""
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                found.append((line[2:], []))
            elif line:
                found[-1][1].append(line)
    return found


def run(command: str, env: dict[str, str]) -> list[str]:
    """What a terminal shows: stdout and stderr in the order they were written."""
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60, env={**os.environ, **env})
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    """``gpu-webhook serve --self-signed`` as the README starts it, on a free port instead of 8443."""
    tmp = tmp_path_factory.mktemp("readme")
    port = free_port()
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*GPU_WEBHOOK, "serve", "--self-signed", "--port", str(port)], stdout=out,
                                stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 30
    while not (printed := re.search(r"^self-signed CA: (\S+)$", log.read_text(), flags=re.M)):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    server = WebhookProcess(port, Path(printed[1]), Path(), Path(), log, proc)
    try:
        wait_ready(server)
        yield server
    finally:
        server.stop()


@pytest.mark.process
def test_the_local_quick_start_prints_what_the_readme_shows(self_signed):
    shown = sessions(section("Quick start: local"))
    assert [command.split()[-1].rsplit("/", 1)[1] for command, _ in shown] == ["validate", "mutate", "validate"]
    for command, expected in shown:
        assert "https://localhost:8443/" in command
        got = run(command.replace(":8443/", f":{self_signed.port}/"), {"CA": str(self_signed.ca)})
        assert got == expected, command


def test_the_patch_the_readme_decodes_is_the_one_mutate_returns():
    (_, [mutated]), = [s for s in sessions(section("Quick start: local")) if s[0].endswith("/mutate")]
    patch = base64.b64decode(json.loads(mutated)["response"]["patch"]).decode()
    assert f"The patch decodes to `{patch}`." in " ".join(section("Quick start: local").split())


# The README's first command installs into .venv and puts nothing on PATH; its later sections activate that venv.
ACTIVATE = ". .venv/bin/activate"


def commands(text: str) -> list[str]:
    """Every command line of the sh and console blocks in ``text``, in order (console output left out)."""
    found: list[str] = []
    for kind, block in re.findall(r"```(sh|console)\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if kind == "sh" and line.strip():
                found.append(line.strip())
            elif kind == "console" and line.startswith("$ "):
                found.append(line[2:])
    return found


def test_every_gpu_webhook_command_runs_from_the_readmes_own_install():
    """A bare ``gpu-webhook`` command works only once the venv the first command made is active."""
    active, bare = False, []
    for command in commands(README):
        active = active or command.split("#")[0].strip() == ACTIVATE
        if re.search(r"(^|[|;&]\s*)gpu-webhook ", command) and not active:
            bare.append(command)
    assert not bare, f"run before `{ACTIVATE}` is shown, so not found on PATH: {bare}"


@pytest.mark.process
@pytest.mark.parametrize("title, tool", [("Quick start: CI", "gpu-webhook check "),
                                         ("Native admission policies", "gpu-webhook admission-policies ")])
def test_the_cli_sessions_print_what_the_readme_shows(title, tool):
    shown = sessions(section(title))
    assert shown and all(command.startswith(tool) for command, _ in shown)
    assert (ROOT / ".venv" / "bin" / "activate").is_file(), "the README's venv: python3 -m venv .venv && ..."
    for command, expected in shown:
        assert run(f"{ACTIVATE} && {command}", {}) == expected, command
