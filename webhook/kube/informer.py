"""One list+watch loop, used once per resource kind that the cluster view reads.

List, then watch from the list's resourceVersion; a watch that ends (the server closes it after
``timeoutSeconds``) resumes from the last resourceVersion seen, bookmarks included; 410 Gone means
that version was compacted away, so list again. Errors back off exponentially and never clear
what was loaded: decisions go on from the last objects known, and the staleness shows in /metrics
per resource. A resource the apiserver does not serve (404: an older cluster, or a disabled API
group) counts as loaded and empty, and is listed again after the longest backoff.

The loop talks to the apiserver through a :class:`Source`, so it is tested with a fake one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from webhook.core.cluster import ClusterKind
from webhook.kube.client import Gone, Kube, NotServed, error_for
from webhook.telemetry import logs, metrics

WATCH_SECONDS = 240  # the server ends a watch after this; we resume from the last version


# A kind the informer lists and watches (``/api/v1/nodes``): the view's own table of kinds.
Resource = ClusterKind


class Source(Protocol):
    def list(self, path: str) -> tuple[list[Mapping[str, Any]], str]:
        """Every object and the list's resourceVersion."""

    def watch(self, path: str, resource_version: str, timeout: int) -> Iterator[Mapping[str, Any]]:
        """Watch events (``{"type", "object"}``) from ``resource_version``, bookmarks allowed."""


class Sink(Protocol):
    """What an informer feeds: the index of one kind in ``webhook.core.clusterindex``."""

    def replace(self, objects: list[Mapping[str, Any]]) -> None: ...

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> None: ...

    def __len__(self) -> int: ...


class Informer:
    def __init__(self, resource: Resource, source: Source, sink: Sink, max_backoff: float = 30.0):
        self.resource = resource
        self.source = source
        self.sink = sink
        self.max_backoff = max_backoff
        self.resource_version: str | None = None
        self.loaded = False
        self.connected = False
        self.served = True
        self.last_sync = 0.0
        self.last_error = ""
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self.run, name=f"watch-{self.resource.name}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stale(self) -> bool:
        return not (self.connected and self.loaded)

    def relist(self) -> None:
        try:
            items, version = self.source.list(self.resource.path)
        except NotServed:
            if self.served or not self.loaded:
                logs.event("informer_not_served", logging.WARNING, resource=self.resource.name)
            self.served = False
            self.sink.replace([])
            self._synced()
            raise
        self.served = True
        self.sink.replace(items)
        self.resource_version = version
        self._synced()
        logs.event("informer_listed", resource=self.resource.name, objects=len(self.sink))

    def _synced(self) -> None:
        self.loaded = True
        self.last_sync = time.time()

    def watch_once(self) -> None:
        assert self.resource_version is not None
        for event in self.source.watch(self.resource.path, self.resource_version, WATCH_SECONDS):
            if self._stop.is_set():
                return
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message", "resource version too old"))
                raise error_for(int(obj.get("code") or 500), "", str(obj.get("message")))
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.sink.apply(kind, obj)
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:  # BOOKMARK events carry only this: we are in sync up to here
                self.resource_version = version
            self.last_sync = time.time()

    def step(self) -> None:
        """One list (when needed) and one watch; raises what the loop backs off from."""
        if self.resource_version is None:
            self.relist()
        self.connected = True
        self.watch_once()

    def run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self.step()
                backoff = 0.5
            except Gone:
                logs.event("informer_gone", resource=self.resource.name, action="relist")
                self.resource_version = None
            except NotServed:
                self.connected = True  # nothing to watch; not stale, but look again later
                self._stop.wait(self.max_backoff)
            except Exception as exc:  # the apiserver may be away: keep what was loaded, retry later
                self.connected = False
                if getattr(exc, "status", None) == 410:
                    self.resource_version = None
                self.last_error = str(exc)[:300]
                logs.event("informer_failed", logging.WARNING, resource=self.resource.name, error=self.last_error,
                           retry_in=round(backoff, 1))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    def report(self) -> None:
        """Set this resource's gauges (called once a second by the reporter thread)."""
        name = self.resource.name
        metrics.INFORMER_OBJECTS.labels(resource=name).set(len(self.sink))
        if self.loaded:
            metrics.INFORMER_AGE.labels(resource=name).set(time.time() - self.last_sync)
        metrics.INFORMER_STALE.labels(resource=name).set(1 if self.stale else 0)


def report_forever(informers: list[Informer], stop: threading.Event, also: Callable[[], None] = lambda: None) -> None:
    def loop() -> None:
        while not stop.wait(1.0):
            for informer in informers:
                metrics.safely(informer.report)
            metrics.safely(also)

    threading.Thread(target=loop, name="informer-metrics", daemon=True).start()


class KubeSource:
    """A :class:`Source` over the one Kubernetes client (``webhook.kube.client``), credentials found as every
    subcommand finds them."""

    def __init__(self, kubeconfig: str | None = None, kube: Kube | None = None, field_selector: str | None = None):
        self.kubeconfig = kubeconfig
        self._kube = kube
        # One object of a collection (``metadata.name=default``): lists and watches of it alone.
        self._selector = {"fieldSelector": field_selector} if field_selector else {}

    def _get(self, path: str, query: dict[str, Any], read_timeout: float) -> Any:
        if self._kube is None:
            self._kube = Kube.connect(self.kubeconfig)
        return self._kube.stream(path, query, read_timeout)

    def list(self, path: str) -> tuple[list[Mapping[str, Any]], str]:
        items: list[Mapping[str, Any]] = []
        token = ""
        while True:  # pages of 500, as client-go's reflector lists
            query: dict[str, Any] = {"limit": 500, **self._selector}
            if token:
                query["continue"] = token
            response = self._get(path, query, 60.0)
            try:
                body = json.loads(response.read())
            finally:
                response.release_conn()
            items.extend(body.get("items") or [])
            metadata = body.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                return items, str(metadata.get("resourceVersion") or "")

    def watch(self, path: str, resource_version: str, timeout: int) -> Iterator[Mapping[str, Any]]:
        query = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": timeout, **self._selector}
        response = self._get(path, query, timeout + 30.0)
        try:
            pending = b""
            for chunk in response.stream(65536, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.release_conn()
