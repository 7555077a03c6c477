"""The HTTP layer: routes, body limit, error answers, metrics and one log line per decision.

It decides nothing: each admission path maps to a Handler from ``webhook.admission``.
Bad requests (400, 404, 405, 413) are HTTP errors; policy denials are 200 with
``allowed: false``; a bug in a handler is answered as an errored review, never a traceback.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webhook import admission, metrics, review
from webhook.nodes import NodeSummary
from webhook.podspecs import as_mapping, is_builtin
from webhook.policy import PolicySet

DEFAULT_MAX_BODY = 7 * 1024 * 1024  # controller-runtime's cap: a 3 MiB object plus oldObject, with room
DEFAULT_HANDLERS: dict[str, admission.Handler] = {
    "/validate": admission.validate,
    "/mutate": admission.mutate,
}

log = logging.getLogger("gpu_webhook")


def _json(body: object, status: int = 200) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status=status, mimetype="application/json")


def _log_decision(endpoint: str, req: Mapping, answer: review.Response, ms: float) -> None:
    obj = as_mapping(req.get("object"))
    kind = as_mapping(req.get("kind"))
    # Paths and rules only: objects carry Secrets and env values, so bodies are never logged.
    log.info(
        json.dumps(
            {
                "event": "admission",
                "endpoint": endpoint,
                "uid": req.get("uid"),
                "kind": kind.get("kind"),
                "namespace": req.get("namespace"),
                "name": admission.object_name(req, obj),
                "operation": req.get("operation"),
                "allowed": answer.allowed,
                "decision": answer.decision,
                "violations": [f"{v.path} ({v.rule})" for v in answer.violations],
                "ms": round(ms, 3),
            }
        )
    )


def create_app(
    policies: Callable[[], PolicySet],
    readiness: Callable[[], str | None],
    max_body: int = DEFAULT_MAX_BODY,
    handlers: Mapping[str, admission.Handler] = DEFAULT_HANDLERS,
    nodes: Callable[[], NodeSummary | None] = lambda: None,
) -> Flask:
    """``policies`` gives the policy in force now, ``nodes`` the node summary (None without cluster
    checks); ``readiness`` gives None when ready, else why not."""
    app = Flask("gpu_webhook")
    app.config["MAX_CONTENT_LENGTH"] = max_body

    def admit(endpoint: str, handler: admission.Handler) -> Response:
        started = time.perf_counter()
        data = request.get_data(cache=False)
        if request.content_length is None and len(data) >= max_body:
            # A chunked body has no length to refuse up front; werkzeug stops reading at the limit.
            raise RequestEntityTooLarge()
        try:
            parsed = review.decode(data)
        except review.BadReview as exc:
            metrics.REQUESTS.labels(endpoint=endpoint, kind="", decision="bad_request").inc()
            return _json({"error": str(exc)}, 400)
        try:
            answer = handler(parsed.request, policies(), nodes())
        except Exception:
            log.exception("handler failed for uid %s", parsed.uid)
            answer = review.errored("internal error in gpu-webhook while evaluating the object")
        body = review.encode(parsed, answer)
        ms = (time.perf_counter() - started) * 1000
        kind = as_mapping(parsed.request.get("kind"))
        kind_name = str(kind.get("kind", ""))
        if not is_builtin(str(kind.get("group") or ""), kind_name):
            kind_name = "custom"  # any client can name any kind: one label keeps the series bounded
        metrics.REQUESTS.labels(endpoint=endpoint, kind=kind_name, decision=answer.decision).inc()
        metrics.LATENCY.labels(endpoint=endpoint).observe(ms / 1000)
        _log_decision(endpoint, parsed.request, answer, ms)
        return _json(body)

    for path, handler in handlers.items():
        app.add_url_rule(
            path,
            endpoint=path.strip("/"),
            view_func=lambda path=path, handler=handler: admit(path.strip("/"), handler),
            methods=["POST"],
        )

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        reason = readiness()
        if reason:
            return Response(f"not ready: {reason}\n", status=503, mimetype="text/plain")
        return Response("ok\n", mimetype="text/plain")

    @app.get("/metrics")
    def metrics_page() -> Response:
        text, content_type = metrics.render()
        return Response(text, content_type=content_type)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        return _json({"error": exc.description, "code": exc.code}, exc.code or 400)

    return app
