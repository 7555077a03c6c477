"""AdmissionReview in and out, and the Response a handler returns.

Like controller-runtime's ``admission.Response``: handlers build one with
:func:`allowed`, :func:`denied` or :func:`patched`; only
:func:`encode` turns it into the wire format, echoing the version it was asked in.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.core.field import Violation

API_GROUP = "admission.k8s.io"
VERSIONS = (f"{API_GROUP}/v1", f"{API_GROUP}/v1beta1")


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer: the HTTP layer turns this into a 400."""


@dataclass(frozen=True)
class Review:
    api_version: str
    request: Mapping[str, Any]

    @property
    def uid(self) -> str:
        return self.request["uid"]


@dataclass(frozen=True)
class Response:
    allowed: bool
    code: int = 200
    message: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[Mapping[str, Any], ...] = field(default=())
    # What the decision found, for logs and metrics; never sent (the message carries it).
    violations: tuple[Violation, ...] = field(default=(), compare=False)
    # deny or warn for each of ``violations``, in order, as the policy in force decided it.
    actions: tuple[str, ...] = field(default=(), compare=False)

    def judged(self) -> tuple[tuple[Violation, str], ...]:
        """Each violation with the action taken on it."""
        return tuple(zip(self.violations, self.actions, strict=True))

    @property
    def decision(self) -> str:
        if not self.allowed:
            return "denied" if self.code == 403 else "error"
        if self.patch:
            return "patched"
        return "warned" if self.warnings else "allowed"


def allowed(
    warnings: tuple[str, ...] | list[str] = (), violations: tuple[Violation, ...] = (), actions: tuple[str, ...] = ()
) -> Response:
    return Response(allowed=True, warnings=tuple(warnings), violations=violations, actions=actions)


def denied(
    message: str,
    warnings: tuple[str, ...] | list[str] = (),
    violations: tuple[Violation, ...] = (),
    code: int = 403,
    actions: tuple[str, ...] = (),
) -> Response:
    return Response(
        allowed=False, code=code, message=message, warnings=tuple(warnings), violations=violations, actions=actions
    )


def patched(ops: Sequence[Mapping[str, Any]], warnings: tuple[str, ...] | list[str] = ()) -> Response:
    return Response(allowed=True, patch=tuple(ops), warnings=tuple(warnings))


def decode(body: bytes) -> Review:
    """The AdmissionReview in ``body``. orjson parses it (strict RFC 8259, about 3x the standard library's
    speed, nesting bounded at 1024 levels)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        # orjson's errors carry no code, only text: tests/test_dependencies.py holds these two words to it.
        reason = str(exc)
        if "depth limit" in reason:  # a nesting bomb: no AdmissionReview is nested this deep
            raise BadReview("body is nested too deeply") from None
        if "infinity" in reason:
            # Beyond a float64, as the apiserver's own decoder sees it (1e400, a 400-digit integer).
            raise BadReview("body has a number out of range") from None
        raise BadReview("body is not JSON") from None
    if not isinstance(document, dict):
        raise BadReview("body is not a JSON object")
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if kind != "AdmissionReview" or api_version not in VERSIONS:
        raise BadReview(f"expected kind AdmissionReview in {' or '.join(VERSIONS)}")
    request = document.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview has no request")
    uid = request.get("uid")
    if uid is None or uid == "":
        raise BadReview("request.uid is missing")
    if not isinstance(uid, str):
        raise BadReview(f"request.uid must be a string, not {type(uid).__name__}")
    return Review(api_version=api_version, request=request)


def encode(review: Review, response: Response) -> dict[str, Any]:
    body: dict[str, Any] = {"uid": review.uid, "allowed": response.allowed}
    if not response.allowed:
        body["status"] = {
            "code": response.code,
            "message": response.message,
            "reason": "Forbidden" if response.code == 403 else "InternalError",
        }
    if response.warnings:
        body["warnings"] = list(response.warnings)
    if response.patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(orjson.dumps(list(response.patch))).decode()
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": body}
