"""Run the app: gunicorn's master process, and workers that serve on an asyncio loop.

gunicorn does what a master does well (fork the workers, respawn one that exits, kill one that stops
heartbeating, pass SIGTERM on); each worker runs ``webhook.serving.connections`` on its own uvloop loop, so a
connection costs no thread and only complete requests reach Flask: bodies up to 256 KiB (every pod) are decided on
the loop itself, larger ones on a small thread pool with a time limit. Each worker owns its reloaders (threads do
not survive fork): policy and certificate files are re-read when their bytes change, and every new TLS handshake
gets the certificate loaded last.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.workers.base import Worker

from webhook.core.cluster import CLUSTER_KINDS, ClusterState
from webhook.core.clusterview import ClusterView
from webhook.core.policy import PolicySet
from webhook.kube.client import Kube
from webhook.kube.informer import Informer, KubeSource, report_forever
from webhook.rules.admission import Handler
from webhook.serving import policies
from webhook.serving.app import DEFAULT_HANDLERS, DEFAULT_MAX_BODY, create_app
from webhook.serving.connections import Front, Limits
from webhook.serving.policyobject import RESOURCE, PolicyObject, field_selector
from webhook.serving.tls import server_context
from webhook.serving.watch import Reloader
from webhook.telemetry import logs, metrics


@dataclass(frozen=True)
class ServeConfig:
    cert_file: str
    key_file: str
    host: str = "0.0.0.0"
    port: int = 8443
    policy_file: str | None = None
    client_ca: str | None = None
    workers: int = 1
    threads: int = 4  # per worker, for bodies over 256 KiB only (smaller ones are decided on the loop)
    max_body: int = DEFAULT_MAX_BODY
    # Longer than the apiserver's 90 s idle timeout, or it reuses connections we just closed.
    keepalive: int = 120
    # After SIGTERM, /readyz fails for this long while requests are still served, so endpoints drain.
    drain_seconds: float = 3.0
    reload_interval: float = 1.0
    # For cluster-aware checks (policy cluster.enabled): None finds credentials as webhook.kube.client does.
    kubeconfig: str | None = None
    # A TLS handshake, and a request from its first byte to its last, must finish within this.
    read_timeout: float = 10.0
    # Plain-HTTP operations port: GET /metrics, /healthz, /readyz. When set, /metrics leaves the admission
    # port, so a NetworkPolicy can open that port to the apiserver only and this one to the monitoring.
    metrics_port: int | None = None
    # serve --audit: the periodic audit, in a process the master starts beside the workers.
    # the command line of that process (``python -m webhook.audit.loop SETTINGS``), built by the CLI
    audit: Sequence[str] | None = None
    # serve --policy-object NAME: the policy is GPUPolicy/NAME's spec, listed and watched by each worker; the
    # policy file (or the built-in defaults) is the fallback while the object is missing.
    policy_object: str | None = None
    # A worker is not ready until its first list of the object answered, for at most this long; then it serves
    # the fallback and says so (an apiserver it cannot reach must not keep the pod unready for ever).
    policy_object_wait: float = 60.0
    # the command line of the status writer's process (``python -m webhook.serving.policystatus SETTINGS``)
    status: Sequence[str] | None = None

    def limits(self) -> Limits:
        return Limits(
            handshake_timeout=self.read_timeout,
            request_timeout=self.read_timeout,
            idle_timeout=float(self.keepalive),
            max_body=self.max_body,
        )


class _WorkerState:
    """What one worker process serves from: the policy and TLS context in force, and whether it drains."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.draining = False
        self.policy = Reloader(
            "policy",
            [config.policy_file] if config.policy_file else [],
            lambda: policies.load(config.policy_file),
            self._file_reloaded,
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

        self._stop = threading.Event()
        self.started = time.monotonic()
        # The one client of this worker, when it reads the policy object (the cluster informers share it).
        self._kube: Kube | None = None
        self.live: PolicyObject | None = None
        self.live_informer: Informer | None = None
        if config.policy_object:
            self._kube = Kube.connect(config.kubeconfig)
            self.live = PolicyObject(
                config.policy_object, lambda: self.policy.value, on_swap=self._check_cluster_toggle,
                on_change=self._object_changed,
                fallback_name=f"the policy file {config.policy_file}" if config.policy_file
                else "the built-in defaults",
            )
            source = KubeSource(config.kubeconfig, kube=self._kube, field_selector=field_selector(config.policy_object))
            self.live_informer = Informer(RESOURCE, source, self.live, max_backoff=10.0)

        # Cluster checks are switched on at start, by the policy in force then; a reload that toggles
        # cluster.enabled takes a restart. With a policy object "start" is its first list (or the wait's end).
        self.cluster: ClusterState | None = None
        self.informers: list[Informer] = []
        self._cluster_lock = threading.Lock()
        self._cluster_decided = False
        # Set to stop this cluster view's watches, its refresher and its gauges (cluster.enabled turned off live).
        self._cluster_stop = threading.Event()
        # Readiness waits for the view decided at start only: one switched on later by an edit of the policy
        # object must not take every replica out of the Service at once (the checks wait for the view anyway).
        self._cluster_gates_readiness = True
        if self.live is None:
            self._decide_cluster(self.policy.value)

    def _file_reloaded(self, ok: bool) -> None:
        metrics.record_reload("policy", ok)
        if ok and (self.live is None or self.live.policy is None):  # the file is the policy in force
            self._check_cluster_toggle(self.policy.value)

    def served_policy(self) -> PolicySet:
        return self.live.value if self.live is not None else self.policy.value

    def _decide_cluster(self, policy: PolicySet) -> None:
        with self._cluster_lock:
            if self._cluster_decided:
                return
            self._cluster_decided = True
            if policy.default.cluster_enabled:
                self._new_cluster(policy)

    def _new_cluster(self, policy: PolicySet) -> None:
        """The cluster view and its watches (under the lock): one list+watch per kind, one connection pool."""
        cluster = ClusterState(policy.default.node_label)
        source = KubeSource(self.config.kubeconfig, kube=self._kube)
        self._cluster_stop = threading.Event()
        self.informers = [Informer(kind, source, cluster.indices[kind.name]) for kind in CLUSTER_KINDS]
        self.cluster = cluster
        if self._running:
            self._start_cluster()

    def _object_changed(self) -> None:
        if self.live is not None and self.live.listed and not self._cluster_decided:
            self._decide_cluster(self.live.value)

    def _policy_wait_over(self) -> None:
        if self.live is not None and not self.live.listed:
            logs.event("policy_object_unlisted", logging.WARNING, name=self.live.name,
                       seconds=self.config.policy_object_wait, serving=self.live.fallback_name,
                       error=self.live_informer.last_error if self.live_informer else "")
            self._decide_cluster(self.served_policy())

    def _check_cluster_toggle(self, policy: PolicySet) -> None:
        if not self._cluster_decided:
            return
        enabled = policy.default.cluster_enabled
        if enabled == (self.cluster is not None):
            return
        if self.live is None:
            # A policy file: the chart gives the pod its token and the reader's RBAC with cluster.enabled only.
            logs.event("policy_cluster_toggle", logging.WARNING, cluster_enabled=enabled,
                       message="cluster.enabled changed: that takes a restart of the webhook's pods; until then "
                       f"cluster checks stay {'on' if self.cluster is not None else 'off'}")
            return
        # The policy object: its client is there, so the view follows the edit (the RBAC to read the cluster is
        # the chart's policy.cluster.enabled; without it the watches fail and the view stays stale, as alerted).
        with self._cluster_lock:
            if enabled:
                self._cluster_gates_readiness = False
                self._new_cluster(policy)
            else:
                self._cluster_stop.set()
                for informer in self.informers:
                    informer.stop()
                self.cluster, self.informers = None, []
        logs.event("policy_cluster_toggled", cluster_enabled=enabled)

    _running = False

    def start(self) -> None:
        self.policy.start()
        self.tls.start()
        with self._cluster_lock:
            self._running = True
            if self.cluster is not None:
                self._start_cluster()
        if self.live_informer is not None:
            self.live_informer.start()
            # gpu_webhook_informer_stale{resource="gpupolicies"} and its age, like the cluster view's watches
            report_forever([self.live_informer], self._stop)
            timer = threading.Timer(self.config.policy_object_wait, self._policy_wait_over)
            timer.daemon = True
            timer.start()

    def _start_cluster(self) -> None:
        assert self.cluster is not None
        stop = self._cluster_stop
        self.cluster.start_refresher(stop)
        for informer in self.informers:
            informer.start()
        if self.informers:
            nodes = self.informers[0]

            def legacy_node_gauges() -> None:  # the node-only gauges documented before the other kinds came
                metrics.NODE_INDEX_NODES.set(len(nodes.sink))
                if nodes.loaded:
                    metrics.NODE_INDEX_AGE.set(time.time() - nodes.last_sync)
                metrics.NODE_INDEX_STALE.set(1 if nodes.stale else 0)

            report_forever(self.informers, stop, legacy_node_gauges)

    def cluster_view(self) -> ClusterView | None:
        return self.cluster.view() if self.cluster is not None else None

    def readiness(self) -> str | None:
        if self.draining:
            return "draining after SIGTERM"
        if self.live is not None and not (self.live.listed and self._cluster_decided):
            if time.monotonic() - self.started < self.config.policy_object_wait:
                return f"waiting for the first list of GPUPolicy/{self.live.name}"
        cluster = self.cluster
        if cluster is not None and self._cluster_gates_readiness and not cluster.loaded:
            return f"waiting for the first list of {', '.join(cluster.waiting_for())}"
        return None


_state: _WorkerState | None = None


class AsyncWorker(Worker):
    """A gunicorn worker whose connections live on a uvloop event loop."""

    def init_signals(self) -> None:
        # The loop installs its own handlers in run(); until then the defaults apply.
        for sig in self.SIGNALS:
            signal.signal(sig, signal.SIG_DFL)

    def run(self) -> None:
        import uvloop

        loop = uvloop.new_event_loop()
        loop.set_exception_handler(_loop_error)
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        assert _state is not None, "the worker serves before its state loaded"
        state = _state
        config = state.config
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        draining = asyncio.Event()
        pool = ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="handler")
        limits = config.limits()
        admission_app = self.wsgi if config.metrics_port is None else _without(OPERATIONS_ONLY, self.wsgi)
        fronts = {
            "admission": Front(admission_app, pool, limits, config.port, lambda: state.tls.value, _log_refusal),
            "operations": Front(_only(OPERATIONS, self.wsgi), pool, limits, config.metrics_port or 0, None,
                                _log_refusal),
        }
        servers = []
        for listener in self.sockets:
            port = listener.sock.getsockname()[1]
            front = fronts["operations" if port == config.metrics_port else "admission"]
            servers.append(await loop.create_server(front.protocol, sock=listener.sock, backlog=self.cfg.backlog))
        loop.add_signal_handler(signal.SIGTERM, draining.set)
        for sig in (signal.SIGINT, signal.SIGQUIT):
            loop.add_signal_handler(sig, stop.set)

        async def heartbeat() -> None:
            # The master kills a worker that stops notifying; the loop notifying means it is not stuck.
            while True:
                self.notify()
                if self.ppid != os.getppid():  # the master is gone: stop with it
                    stop.set()
                await asyncio.sleep(1.0)

        beat = loop.create_task(heartbeat())
        drained = loop.create_task(draining.wait())
        stopped = loop.create_task(stop.wait())
        await asyncio.wait([drained, stopped], return_when=asyncio.FIRST_COMPLETED)
        if draining.is_set() and not stop.is_set():
            # Readiness fails first; requests are still served while endpoints catch up.
            state.draining = True
            logs.event("draining", seconds=config.drain_seconds)
            await asyncio.wait([stopped], timeout=config.drain_seconds)
        for server in servers:
            server.close()
        grace = 0 if stop.is_set() else max(1.0, self.cfg.graceful_timeout - config.drain_seconds - 2)
        cut = sum(await asyncio.gather(*(front.drain(grace) for front in fronts.values())))
        logs.event("stopped", connections_cut=cut)
        beat.cancel()
        drained.cancel()
        stopped.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        self.alive = False


OPERATIONS = frozenset({"/metrics", "/healthz", "/readyz"})
OPERATIONS_ONLY = frozenset({"/metrics"})


def _only(paths: frozenset[str], app: Any) -> Any:
    """The app for the paths given; 404 for anything else (the operations port serves no admissions)."""

    def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") in paths:
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "application/json")])
        return [b'{"error":"not served on this port","code":404}']

    return wsgi


def _without(paths: frozenset[str], app: Any) -> Any:
    def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") not in paths:
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "application/json")])
        return [b'{"error":"served on the metrics port","code":404}']

    return wsgi


def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """What the loop cannot hand to anybody (a transport's fatal error), as one JSON line."""
    exc = context.get("exception")
    logs.event(
        "loop_error",
        logging.ERROR,
        exc_info=exc is not None and not isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)),
        message=str(context.get("message", "")),
        error=repr(exc) if exc is not None else None,
    )


def _log_refusal(status: int, reason: str, peer: str) -> None:
    logs.event("refused", status=status, reason=reason, remote=peer)
    metrics.count_refusal(status)


def _child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


class JsonGunicornLogger(glogging.Logger):
    """gunicorn's own lines (worker boot, exit, timeouts) as JSON, like every other line."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in list(self.error_log.handlers):
            self.error_log.removeHandler(handler)
        self.error_log.addHandler(logs.JsonHandler())


class AuditProcess:
    """A process the master runs beside its workers: the periodic audit's (``webhook.audit.loop``) or the
    policy status writer's (``webhook.serving.policystatus``), started with the workers, restarted with a
    growing delay when it exits, stopped before them; ``name`` begins its log lines' events.

    The master reaps every child (``os.waitpid(-1)``), so the exit status is gone by the time we look:
    ``Popen.poll`` then reads 0, which is enough to know it exited.
    """

    def __init__(self, command: Sequence[str], name: str = "audit"):
        self.command = list(command)
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.not_before = 0.0
        self.delay = 1.0

    def check(self) -> None:
        now = time.monotonic()
        if self.proc is not None:
            if self.proc.poll() is None:
                return
            pid, lived = self.proc.pid, now - self.started
            self.proc = None
            self.delay = 1.0 if lived > 300 else min(self.delay * 2, 60.0)
            self.not_before = now + self.delay
            metrics.safely(_mark_dead, pid)
            logs.event(f"{self.name}_process_exited", logging.WARNING, pid=pid, seconds=round(lived, 1),
                       restart_in=self.delay)
            return
        if now >= self.not_before:
            self.proc = subprocess.Popen(self.command)
            self.started = now
            logs.event(f"{self.name}_process_started", pid=self.proc.pid)

    def terminate(self) -> None:
        """Ask it to stop: it gives the Lease back and exits between two pages."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def wait(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        metrics.safely(_mark_dead, self.proc.pid)
        self.proc = None


def _mark_dead(pid: int) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)


class _Arbiter(Arbiter):
    """gunicorn's master, also minding its other processes (the audit's, the status writer's): checked on every
    turn of its loop (about a second).

    Not a public route: gunicorn has no server hook per turn of the master's loop (``child_exit`` is told of
    workers only) nor one before it stops the workers, so this overrides ``manage_workers`` and ``stop``.
    pyproject pins gunicorn below its next major version, and tests/test_dependencies.py fails, saying so, if the
    loop stops calling either.
    """

    children: tuple[AuditProcess, ...] = ()

    def manage_workers(self) -> None:
        super().manage_workers()
        for child in self.children:
            child.check()

    def stop(self, graceful: bool = True) -> None:
        # The workers get SIGTERM at once (their drain must not wait for the others); the others' own stop
        # overlaps with theirs and is waited for after.
        for child in self.children:
            child.terminate()
        super().stop(graceful)
        for child in self.children:
            child.wait()


class _Application(BaseApplication):
    def __init__(self, config: ServeConfig, handlers: Mapping[str, Handler]):
        self.config = config
        self.handlers = handlers
        super().__init__()

    def run(self) -> None:
        arbiter = _Arbiter(self)
        children = []
        if self.config.audit is not None:
            children.append(AuditProcess(self.config.audit))
        if self.config.status is not None:
            children.append(AuditProcess(self.config.status, "policy_status"))
        arbiter.children = tuple(children)
        try:
            arbiter.run()
        except RuntimeError as exc:  # as BaseApplication.run reports it
            print(f"\nError: {exc}\n", file=sys.stderr, flush=True)
            sys.exit(1)

    def load_config(self) -> None:
        c = self.config
        host = f"[{c.host}]" if ":" in c.host else c.host
        binds = [f"{host}:{c.port}"] + ([f"{host}:{c.metrics_port}"] if c.metrics_port else [])
        settings = {
            "bind": binds,
            "workers": c.workers,
            "worker_class": "webhook.serving.server.AsyncWorker",
            "timeout": 30,
            "graceful_timeout": int(c.drain_seconds) + 20,
            "child_exit": _child_exit,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "warning",
            "logger_class": "webhook.serving.server.JsonGunicornLogger",
            "proc_name": "gpu-webhook",
            "backlog": 2048,
        }
        # gunicorn 25+ opens a control socket (it accepts "worker kill") under $HOME by default: several
        # servers on one host would share it, and a read-only container cannot create it.
        if "control_socket_disable" in self.cfg.settings:
            settings["control_socket_disable"] = True
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        # Runs in each worker after fork.
        global _state
        logs.configure()
        _state = _WorkerState(self.config)
        _state.start()
        state = _state
        app = create_app(
            state.served_policy, state.readiness, self.config.max_body, self.handlers, state.cluster_view
        )
        # Modules, the app and the policy live as long as the worker: take them out of the collector's
        # reach, so a full collection walks only what requests left behind. Without this, every few
        # thousand requests one walks all ~40k objects and stops the worker for 30-60 ms.
        gc.freeze()
        return app


def serve(config: ServeConfig, handlers: Mapping[str, Handler] = DEFAULT_HANDLERS) -> None:
    """Block serving until stopped. Policy and certificate must load now, or this raises (``PolicyError``,
    ``ssl.SSLError``, ``OSError``)."""
    policies.load(config.policy_file)
    server_context(config.cert_file, config.key_file, config.client_ca)
    logs.configure()
    logs.event("serving", host=config.host, port=config.port, workers=config.workers)
    _Application(config, handlers).run()

