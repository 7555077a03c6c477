"""Run the app under gunicorn: threaded workers, TLS from a watched certificate, graceful drain.

Each worker process owns its reloaders (threads do not survive fork). gunicorn asks for an
SSLContext per connection; we hand it the one built at the last certificate load, so a
rotated Secret reaches new connections within a poll interval and a handshake never
loads files.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.workers.gthread import _DEFER, DEFAULT_WORKER_DATA_TIMEOUT, ThreadWorker

from webhook import metrics
from webhook.admission import Handler
from webhook.app import DEFAULT_HANDLERS, DEFAULT_MAX_BODY, create_app
from webhook.nodes import NodeIndex, NodeSummary
from webhook.nodewatch import NodeWatcher
from webhook.policy import load_policy
from webhook.tls import server_context
from webhook.watch import Reloader


@dataclass(frozen=True)
class ServeConfig:
    cert_file: str
    key_file: str
    host: str = "0.0.0.0"
    port: int = 8443
    policy_file: str | None = None
    client_ca: str | None = None
    workers: int = 1
    threads: int = 8
    max_body: int = DEFAULT_MAX_BODY
    # Longer than the apiserver's 90 s idle timeout, or it reuses connections we just closed.
    keepalive: int = 120
    # After SIGTERM, /readyz fails for this long while requests are still served, so endpoints drain.
    drain_seconds: float = 3.0
    reload_interval: float = 1.0
    # For cluster-aware checks (policy cluster.enabled): None means the in-cluster service account.
    kubeconfig: str | None = None


class _WorkerState:
    """What one worker process serves from: the policy and TLS context in force, and whether it drains."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.draining = False
        self.policy = Reloader(
            "policy",
            [config.policy_file] if config.policy_file else [],
            lambda: load_policy(config.policy_file),
            lambda ok: metrics.record_reload("policy", ok),
            config.reload_interval,
        )
        tls_files = [config.cert_file, config.key_file] + ([config.client_ca] if config.client_ca else [])
        self.tls = Reloader(
            "certificate",
            tls_files,
            lambda: server_context(config.cert_file, config.key_file, config.client_ca),
            lambda ok: metrics.record_reload("certificate", ok),
            config.reload_interval,
        )

        # Cluster checks are switched on at start; a reload that toggles cluster.enabled takes a restart.
        initial = self.policy.value.default
        self.nodes = NodeIndex(initial.node_label) if initial.cluster_enabled else None
        self.watcher = NodeWatcher(self.nodes, config.kubeconfig) if self.nodes is not None else None

    def start(self) -> None:
        self.policy.start()
        self.tls.start()
        if self.watcher is not None:
            self.watcher.start()

    def node_summary(self) -> NodeSummary | None:
        return self.nodes.summary() if self.nodes is not None else None

    def readiness(self) -> str | None:
        if self.draining:
            return "draining after SIGTERM"
        if self.nodes is not None and not self.nodes.loaded:
            return "waiting for the first list of nodes"
        return None


_state: _WorkerState | None = None


def _ssl_context(conf: Any, default_factory: Any) -> Any:
    assert _state is not None, "TLS requested before the worker loaded its state"
    return _state.tls.value


class DrainingWorker(ThreadWorker):
    """On SIGTERM: fail readiness first, keep serving for ``drain_seconds``, then stop gracefully.

    A new TLS connection gets its handshake on a worker thread, then goes back to the poller unless
    its first request is already there. gunicorn would block the thread until that request; Go
    clients, the apiserver among them, keep freshly handshaken connections idle in their pool, and
    ``threads`` such connections stall the whole worker (bench/README.md, "idle TLS connections").
    """

    def handle(self, conn: Any) -> Any:
        if self.cfg.is_ssl and not conn.initialized:
            if not conn.data_ready and not conn.wait_for_data(DEFAULT_WORKER_DATA_TIMEOUT):
                return _DEFER
            try:
                conn.sock.setblocking(True)
                conn.init()  # the TLS handshake
            except (OSError, ValueError) as exc:
                self.log.debug("TLS handshake failed: %s", exc)
                return False
            conn.data_ready = False
            if not conn.sock.pending() and not conn.wait_for_data(0.01):
                return _DEFER  # the poller gives it back to a thread when the request arrives
        return super().handle(conn)

    def handle_exit(self, sig: int, frame: Any) -> None:
        state = _state
        if state is None or state.draining:
            super().handle_exit(sig, frame)
            return
        state.draining = True
        timer = threading.Timer(state.config.drain_seconds, super().handle_exit, (sig, frame))
        timer.daemon = True
        timer.start()


def _child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def _configure_logging() -> None:
    logger = logging.getLogger("gpu_webhook")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


class _Application(BaseApplication):
    def __init__(self, config: ServeConfig, handlers: Mapping[str, Handler]):
        self.config = config
        self.handlers = handlers
        super().__init__()

    def load_config(self) -> None:
        c = self.config
        host = f"[{c.host}]" if ":" in c.host else c.host
        settings = {
            "bind": [f"{host}:{c.port}"],
            "workers": c.workers,
            "worker_class": "webhook.server.DrainingWorker",
            "threads": c.threads,
            "keepalive": c.keepalive,
            "timeout": 30,
            "graceful_timeout": int(c.drain_seconds) + 20,
            "certfile": c.cert_file,
            "keyfile": c.key_file,
            "ssl_context": _ssl_context,
            "child_exit": _child_exit,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "warning",
            "proc_name": "gpu-webhook",
            # gunicorn's control socket (for gunicornc) would go to $HOME/.gunicorn/, outside /tmp: on the
            # image's read-only root filesystem it fails, and nothing here uses it.
            "control_socket_disable": True,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        # Runs in each worker after fork.
        global _state
        _configure_logging()
        _state = _WorkerState(self.config)
        _state.start()
        state = _state
        app = create_app(
            lambda: state.policy.value, state.readiness, self.config.max_body, self.handlers, state.node_summary
        )
        # Modules, the app and the policy live as long as the worker: take them out of the collector's
        # reach, so a full collection walks only what requests left behind. Without this, every few
        # thousand requests one walks all ~40k objects and stops the worker for 30-60 ms.
        gc.freeze()
        return app


def serve(config: ServeConfig, handlers: Mapping[str, Handler] = DEFAULT_HANDLERS) -> None:
    """Block serving until stopped. Policy and certificate must load now, or this raises."""
    load_policy(config.policy_file)
    server_context(config.cert_file, config.key_file, config.client_ca)
    _configure_logging()
    logging.getLogger("gpu_webhook").info(
        '{"event": "serving", "host": "%s", "port": %d, "workers": %d}', config.host, config.port, config.workers
    )
    _Application(config, handlers).run()
