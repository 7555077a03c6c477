"""Keep a NodeIndex current from the apiserver: list, then watch from the list's resourceVersion.

A dropped watch resumes from the last resourceVersion seen; 410 Gone means that version is
compacted away, so we list again. Errors back off exponentially and never clear the index:
decisions go on from the last nodes known, and the staleness shows in /metrics.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from webhook import logs, metrics
from webhook.nodes import NodeIndex

WATCH_SECONDS = 240  # the server ends a watch after this; we resume from the last version


class Gone(Exception):
    """The watched resourceVersion is too old (HTTP 410): list again."""


def api_client(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


class NodeWatcher:
    def __init__(self, index: NodeIndex, kubeconfig: str | None = None, max_backoff: float = 30.0):
        self.index = index
        self.kubeconfig = kubeconfig
        self.max_backoff = max_backoff
        self.resource_version: str | None = None
        self.connected = False
        self._stop = threading.Event()
        self._core: Any = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="node-watch", daemon=True).start()
        threading.Thread(target=self._report, name="node-index-metrics", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _api(self) -> Any:
        if self._core is None:
            from kubernetes import client

            self._core = client.CoreV1Api(api_client(self.kubeconfig))
        return self._core

    def list_nodes(self) -> None:
        response = self._api().list_node(_preload_content=False, _request_timeout=30)
        body = json.loads(response.data)
        self.index.replace(body.get("items") or [])
        self.resource_version = body["metadata"]["resourceVersion"]
        logs.event("nodes_listed", nodes=len(self.index))

    def watch_nodes(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        response = self._api().list_node(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            _request_timeout=WATCH_SECONDS + 30,
        )
        try:
            for line in iter_resp_lines(response):
                if self._stop.is_set():
                    return
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(obj.get("message", "resource version too old"))
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.index.apply(kind, obj)
                else:  # BOOKMARK: nothing changed, but we are in sync up to here
                    self.index.touch()
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.resource_version = version
        finally:
            response.release_conn()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self.list_nodes()
                self.connected = True
                self.watch_nodes()
                backoff = 0.5
            except Gone:
                logs.event("node_watch_gone", action="relist")
                self.resource_version = None
            except Exception as exc:  # the apiserver may be away: keep the index, retry later
                self.connected = False
                if getattr(exc, "status", None) == 410:
                    self.resource_version = None
                logs.event("node_watch_failed", logging.WARNING, error=str(exc)[:300], retry_in=round(backoff, 1))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    def _report(self) -> None:
        while not self._stop.wait(1.0):
            metrics.NODE_INDEX_NODES.set(len(self.index))
            if self.index.loaded:
                metrics.NODE_INDEX_AGE.set(time.time() - self.index.last_sync)
            metrics.NODE_INDEX_STALE.set(0 if self.connected and self.index.loaded else 1)
