"""The HTTP layer: routes, body limit, error answers, metrics and one log line per decision.

It decides nothing: each admission path maps to a Handler from ``webhook.rules.admission``.
Bad requests (400, 404, 405, 413) are HTTP errors; policy denials are 200 with
``allowed: false``; a bug in a handler is an HTTP 500 (a failed call: the apiserver applies the
webhook's failurePolicy), logged with its traceback as one JSON line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from webhook.core import review
from webhook.core.clusterview import ClusterView
from webhook.core.podspecs import as_mapping, is_builtin
from webhook.core.policy import PolicySet
from webhook.rules import admission
from webhook.telemetry import logs, metrics

DEFAULT_MAX_BODY = 7 * 1024 * 1024  # controller-runtime's cap: a 3 MiB object plus oldObject, with room
DEFAULT_HANDLERS: dict[str, admission.Handler] = {
    "/validate": admission.validate,
    "/mutate": admission.mutate,
}


def _json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, mimetype="application/json")


def _log_decision(endpoint: str, req: Mapping, answer: review.Response, ms: float) -> None:
    obj = as_mapping(req.get("object"))
    kind = as_mapping(req.get("kind"))
    # Paths and rules only: objects carry Secrets and env values, so bodies are never logged.
    logs.event(
        "admission",
        endpoint=endpoint,
        uid=req.get("uid"),
        kind=kind.get("kind"),
        namespace=req.get("namespace"),
        name=admission.object_name(req, obj),
        operation=req.get("operation"),
        allowed=answer.allowed,
        decision=answer.decision,
        violations=[f"{v.path} ({v.rule})" for v in answer.violations],
        ms=round(ms, 3),
    )


class Health:
    """Whether this worker can decide at all: a worker that only answers 500 must not be Ready.

    Readiness fails after ``limit`` internal errors in a row (a success clears it), and when the
    validating handler cannot decide a known-good review, checked on every readiness probe.
    """

    def __init__(self, limit: int = 3):
        self.limit = limit
        self.errors_in_a_row = 0

    def record(self, ok: bool) -> None:
        self.errors_in_a_row = 0 if ok else self.errors_in_a_row + 1

    def problem(self, handler: admission.Handler | None, policies: PolicySet,
                view: ClusterView | None) -> str | None:
        if self.errors_in_a_row >= self.limit:
            return f"the last {self.errors_in_a_row} admission requests failed with internal errors"
        if handler is not None:
            try:
                handler(_PROBE, policies, view)
            except Exception as exc:
                return f"the handler fails on a known-good review: {type(exc).__name__}"
        return None


# A GPU pod every policy can judge: the readiness probe runs the real handler on it.
_PROBE: Mapping = {
    "uid": "readiness-probe",
    "kind": {"group": "", "version": "v1", "kind": "Pod"},
    "namespace": "default",
    "operation": "CREATE",
    "object": {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "readiness-probe"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    },
}


def create_app(
    policies: Callable[[], PolicySet],
    readiness: Callable[[], str | None],
    max_body: int = DEFAULT_MAX_BODY,
    handlers: Mapping[str, admission.Handler] = DEFAULT_HANDLERS,
    view: Callable[[], ClusterView | None] = lambda: None,
) -> Flask:
    """``policies`` gives the policy in force now, ``view`` the cluster view (None without cluster
    checks); ``readiness`` gives None when ready, else why not."""
    app = Flask("gpu_webhook")
    app.config["MAX_CONTENT_LENGTH"] = max_body
    health = Health()

    def admit(endpoint: str, handler: admission.Handler) -> Response:
        started = time.perf_counter()
        data = request.get_data(cache=False)
        if request.content_length is None and len(data) >= max_body:
            # A chunked body has no length to refuse up front; werkzeug stops reading at the limit.
            raise RequestEntityTooLarge()
        try:
            parsed = review.decode(data)
        except review.BadReview as exc:
            metrics.safely(metrics.count_request, endpoint, "", "bad_request")
            logs.event("bad_request", logging.WARNING, endpoint=endpoint, status=400, reason=str(exc),
                       remote=request.remote_addr)
            return _json({"error": str(exc)}, 400)
        try:
            answer = handler(parsed.request, policies(), view())
        except Exception:
            # Not a denial: an HTTP 500 is a failed call, so the apiserver applies the operator's
            # failurePolicy (a well-formed allowed: false would be a rejection whatever the policy says).
            health.record(False)
            metrics.safely(metrics.count_request, endpoint, _kind_label(parsed.request), "error")
            logs.event("handler_failed", logging.ERROR, exc_info=True, endpoint=endpoint, uid=parsed.uid)
            return _json({"error": "internal error in gpu-webhook while evaluating the object"}, 500)
        health.record(True)
        body = review.encode(parsed, answer)
        ms = (time.perf_counter() - started) * 1000
        metrics.safely(metrics.count_request, endpoint, _kind_label(parsed.request), answer.decision)
        metrics.safely(metrics.count_violations, endpoint, [(v.rule, action) for v, action in answer.judged()])
        metrics.safely(metrics.observe_latency, endpoint, ms / 1000)
        _log_decision(endpoint, parsed.request, answer, ms)
        return _json(body)

    for path, handler in handlers.items():
        app.add_url_rule(
            path,
            endpoint=path.strip("/"),
            view_func=lambda path=path, handler=handler: admit(path.strip("/"), handler),
            methods=["POST"],
        )
    probe_handler = handlers.get("/validate")

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        reason = readiness() or health.problem(probe_handler, policies(), view())
        if reason:
            return Response(f"not ready: {reason}\n", status=503, mimetype="text/plain")
        return Response("ok\n", mimetype="text/plain")

    @app.get("/metrics")
    def metrics_page() -> Response:
        text, content_type = metrics.render()
        return Response(text, content_type=content_type)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        code = exc.code or 400
        if code in (400, 413):
            logs.event("bad_request", logging.WARNING, path=request.path, status=code, reason=exc.description,
                       remote=request.remote_addr)
        response = _json({"error": exc.description, "code": code}, code)
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            response.headers["Allow"] = ", ".join(exc.valid_methods)
        return response

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        logs.event("server_error", logging.ERROR, exc_info=True, path=request.path)
        return _json({"error": "internal error"}, 500)

    return app


def _kind_label(req: Mapping) -> str:
    kind = as_mapping(req.get("kind"))
    name = str(kind.get("kind", ""))
    # Any client can name any kind: one label for everything not built in keeps the series bounded.
    return name if is_builtin(str(kind.get("group") or ""), name) else "custom"
