"""Reload a value from files when their bytes change, keeping the last good one.

Kubernetes updates mounted Secrets and ConfigMaps by swapping a ``..data`` symlink, which
inotify watches on the file miss; polling the bytes sees every swap. A broken new version
is reported and ignored, so a bad rollout never takes down a working server (the same
contract as controller-runtime's certwatcher).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from webhook.telemetry import logs

T = TypeVar("T")


def _read_all(paths: Sequence[Path]) -> tuple[bytes | None, ...]:
    contents: list[bytes | None] = []
    for path in paths:
        try:
            contents.append(path.read_bytes())
        except OSError:
            contents.append(None)
    return tuple(contents)


class Reloader(Generic[T]):
    """Holds ``load()``'s latest good result; the first load must succeed (fail fast at start)."""

    def __init__(
        self,
        name: str,
        paths: Sequence[str | Path],
        load: Callable[[], T],
        on_reload: Callable[[bool], None] = lambda ok: None,
        interval: float = 1.0,
    ):
        self.name = name
        self.paths = [Path(p) for p in paths]
        self._load = load
        self._on_reload = on_reload
        self.interval = interval
        self._seen = _read_all(self.paths)
        self.value: T = load()
        self._stop = threading.Event()

    def check(self) -> bool:
        """Reload if the files changed; True when a new value was swapped in."""
        seen = _read_all(self.paths)
        if seen == self._seen:
            return False
        try:
            value = self._load()
        except Exception as exc:  # any failure keeps the last good value: that is the point
            self._seen = seen
            logs.event("reload_failed", logging.ERROR, what=self.name, error=str(exc))
            self._on_reload(False)
            return False
        # A swap between our read and the load would pair new bytes with an old signature;
        # only a stable read counts as seen, so the next poll settles it.
        self._seen = seen if _read_all(self.paths) == seen else ()
        self.value = value
        logs.event("reloaded", what=self.name)
        self._on_reload(True)
        return True

    def start(self) -> None:
        thread = threading.Thread(target=self._run, name=f"reload-{self.name}", daemon=True)
        thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()
