"""The one client for the Kubernetes API: the audit's requests, the informers' lists and watches, the Lease.

Credentials are found one way for every subcommand (:func:`configuration`), the order controller-runtime
uses for controllers: ``--kubeconfig``, else ``$KUBECONFIG``, else the pod's service account when running
in a cluster, else ``~/.kube/config``. The kubernetes package's loaders read them (kubeconfig files with exec
plugins and client certificates, or the service account, whose token they re-read when it rotates). The
requests go through a urllib3 pool of our own instead of the generated client: a list page is read and
parsed once into plain dicts, no model objects are built, and every request is counted, so the audit can
say what it cost the apiserver. Every failure is an :class:`ApiError` (``Gone`` and ``NotServed`` for the
two statuses a watch acts on) or a :class:`ConfigError`; nothing of urllib3 or kubernetes leaks out.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from webhook.core.policyfile import yaml_error_line

JSON = "application/json"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: server-side apply takes a JSON body
_MAX_THROTTLE_RETRIES = 3  # 429 (API Priority and Fairness): wait as told, at most this often
_MAX_RETRY_AFTER = 10.0


class ConfigError(Exception):
    """No usable connection settings: no kubeconfig, a broken one, and not in a cluster."""


class ApiError(Exception):
    """The apiserver refused (``status`` is the HTTP code) or could not be reached (``status`` 0)."""

    def __init__(self, status: int, reason: str, message: str, body: Mapping[str, Any] | None = None):
        super().__init__(f"{reason}: {message}" if reason else f"HTTP {status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body: Mapping[str, Any] = body or {}


class NotServed(ApiError):
    """404 on a list: the apiserver does not serve this resource (DRA off, an older cluster)."""

    def __init__(self, message: str = "not served", body: Mapping[str, Any] | None = None):
        super().__init__(404, "NotFound", message, body)


class Gone(ApiError):
    """410 on a watch: the resourceVersion is too old; list again."""

    def __init__(self, message: str = "resource version too old", body: Mapping[str, Any] | None = None):
        super().__init__(410, "Expired", message, body)


def error_for(status: int, reason: str, message: str, body: Mapping[str, Any] | None = None) -> ApiError:
    """The error of an HTTP status: the one mapping from statuses to exceptions."""
    if status == 404:
        return NotServed(message, body)
    if status == 410:
        return Gone(message, body)
    return ApiError(status, reason, message, body)


# Where credentials come from without an explicit kubeconfig, in the order configuration() tries them; the CLI's
# --kubeconfig help of every subcommand says it with these words.
DEFAULT_CREDENTIALS = "$KUBECONFIG, the in-cluster service account, ~/.kube/config"


def configuration(kubeconfig: str | None = None) -> Any:
    """Connection settings, found as controller-runtime finds them: ``kubeconfig``, else $KUBECONFIG, else the
    pod's service account, else ~/.kube/config. :class:`ConfigError` in one line when none is usable."""
    from kubernetes import client, config

    settings = client.Configuration()
    explicit = kubeconfig or os.environ.get("KUBECONFIG")
    home = Path.home() / ".kube" / "config"
    try:
        if explicit:
            for path in explicit.split(os.pathsep):
                if path and not Path(path).is_file():
                    raise ConfigError(f"kubeconfig {path}: no such file")
            config.load_kube_config(config_file=explicit, client_configuration=settings, persist_config=False)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=settings)
        elif home.exists():
            config.load_kube_config(config_file=str(home), client_configuration=settings, persist_config=False)
        else:
            raise ConfigError("no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not running in a cluster")
    except ConfigError:
        raise
    except Exception as exc:  # ConfigException, OSError, YAML errors: one line for the user
        where = explicit or ("the in-cluster service account" if os.environ.get("KUBERNETES_SERVICE_HOST") else home)
        import yaml  # loaded by the kubernetes loader already; not at import time, which workers pay for

        if isinstance(exc, yaml.YAMLError):  # (line N, column M), not PyYAML's 'in "<file>", line N, column M'
            message = f"not valid YAML: {yaml_error_line(exc)}"
        else:
            message = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"cannot load {where}: {message}") from None
    return settings


class Kube:
    """Requests to one apiserver; ``requests`` counts every HTTP request sent (retries included)."""

    def __init__(self, settings: Any, timeout: float = 60.0, pool_size: int = 4):
        import urllib3

        self.host = str(settings.host).rstrip("/")
        self.settings = settings
        self.timeout = timeout
        self.requests = 0
        self.bytes_received = 0
        self._lock = threading.Lock()
        tls: dict[str, Any] = {
            "cert_reqs": "CERT_REQUIRED" if settings.verify_ssl else "CERT_NONE",
            "ca_certs": settings.ssl_ca_cert,
            "cert_file": settings.cert_file,
            "key_file": settings.key_file,
        }
        if getattr(settings, "assert_hostname", None) is not None:
            tls["assert_hostname"] = settings.assert_hostname
        if getattr(settings, "tls_server_name", None):
            tls["server_hostname"] = settings.tls_server_name
        # One connect retry: a refused connection is answered in a second, not after urllib3's default three.
        # Statuses come back as they are: 429 is retried below, as long as its Retry-After says.
        retries = urllib3.Retry(total=1, connect=1, read=0, status=0, redirect=0, backoff_factor=0.2,
                                status_forcelist=(), respect_retry_after_header=False, raise_on_status=False)
        pool: Any
        if getattr(settings, "proxy", None):
            pool = urllib3.ProxyManager(settings.proxy, proxy_headers=settings.proxy_headers, maxsize=pool_size,
                                        retries=retries, **tls)
        else:
            pool = urllib3.PoolManager(maxsize=pool_size, retries=retries, **tls)
        self._pool = pool

    def close(self) -> None:
        self._pool.clear()

    @classmethod
    def connect(cls, kubeconfig: str | None = None, **kw: Any) -> Kube:
        return cls(configuration(kubeconfig), **kw)

    def _headers(self, accept: str, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": "gpu-webhook-audit"}
        if content_type:
            headers["Content-Type"] = content_type
        auth = self.settings.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers["Authorization"] = auth["value"]
        return headers

    def request(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        accept: str = JSON,
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer, or :class:`ApiError`."""
        import urllib3

        url = self.host + quote(path, safe="/:")
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = orjson.dumps(body) if body is not None else None
        if data is not None and content_type is None:
            content_type = JSON
        for attempt in range(_MAX_THROTTLE_RETRIES + 1):
            with self._lock:
                self.requests += 1
            try:
                response = self._pool.request(
                    method, url, body=data, headers=self._headers(accept, content_type),
                    timeout=urllib3.Timeout(connect=min(10.0, self.timeout), read=self.timeout),
                )
            except urllib3.exceptions.HTTPError as exc:
                reason = getattr(exc, "reason", None) or exc
                raise ApiError(0, "Unreachable", f"cannot reach the apiserver at {self.host}: {reason}") from None
            raw = response.data
            with self._lock:
                self.bytes_received += len(raw)
            if response.status == 429 and attempt < _MAX_THROTTLE_RETRIES:
                time.sleep(_retry_after(response.headers.get("Retry-After")))
                continue
            break
        try:
            decoded = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            decoded = {"message": raw[:300].decode("utf-8", "replace")}
        if response.status >= 400:
            if not isinstance(decoded, dict):
                decoded = {}
            raise error_for(
                response.status,
                str(decoded.get("reason") or response.reason or ""),
                str(decoded.get("message") or f"HTTP {response.status} from {method} {path}"),
                decoded,
            )
        return decoded if isinstance(decoded, dict) else {"items": decoded}

    def dry_run(self, path: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any], list[str]]:
        """A server-side dry-run create of ``body`` in the collection ``path`` (``?dryRun=All``): the status, the
        answer (the object as admitted, or the Status of a refusal) and the warnings the apiserver sent (its
        ``Warning`` headers, text only). A refusal is an answer here, not an error; an unreachable apiserver is
        :class:`ApiError`."""
        import urllib3

        url = self.host + quote(path, safe="/:") + "?dryRun=All"
        with self._lock:
            self.requests += 1
        try:
            response = self._pool.request(
                "POST", url, body=orjson.dumps(body), headers=self._headers(JSON, JSON),
                timeout=urllib3.Timeout(connect=min(10.0, self.timeout), read=self.timeout),
            )
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ApiError(0, "Unreachable", f"cannot reach the apiserver at {self.host}: {reason}") from None
        try:
            decoded = orjson.loads(response.data) if response.data else {}
        except orjson.JSONDecodeError:
            decoded = {"message": response.data[:300].decode("utf-8", "replace")}
        warnings = [_warning_text(w) for w in response.headers.getlist("Warning")]
        return response.status, decoded if isinstance(decoded, dict) else {}, warnings

    def get_text(self, path: str) -> str:
        """A plain-text resource, like the apiserver's /metrics."""
        import urllib3

        with self._lock:
            self.requests += 1
        try:
            response = self._pool.request("GET", self.host + path, headers=self._headers("text/plain", None),
                                          timeout=urllib3.Timeout(connect=10.0, read=self.timeout))
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, "Unreachable", f"cannot reach the apiserver at {self.host}: {exc}") from None
        if response.status >= 400:
            raise ApiError(response.status, str(response.reason or ""), f"HTTP {response.status} from GET {path}")
        return response.data.decode("utf-8", "replace")

    def stream(self, path: str, query: Mapping[str, Any], read_timeout: float) -> Any:
        """A GET whose body is read as it comes (a watch): the urllib3 response, to be released by the caller;
        :class:`ApiError` (:class:`Gone`, :class:`NotServed`) for any status but 200."""
        import urllib3

        url = self.host + quote(path, safe="/:") + "?" + urlencode(dict(query))
        with self._lock:
            self.requests += 1
        try:
            response = self._pool.request(
                "GET", url, headers=self._headers(JSON, None), preload_content=False, retries=False,
                timeout=urllib3.Timeout(connect=10.0, read=read_timeout),
            )
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ApiError(0, "Unreachable", f"cannot reach the apiserver at {self.host}: {reason}") from None
        if response.status != 200:
            text = response.read(4096).decode("utf-8", "replace")
            response.release_conn()
            raise error_for(response.status, str(response.reason or ""), text[:300])
        return response

    def get(self, path: str, query: Mapping[str, Any] | None = None, accept: str = JSON) -> dict[str, Any]:
        return self.request("GET", path, query, accept=accept)

    def apply(self, path: str, body: Mapping[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply: the object becomes what ``body`` says for the fields this manager owns."""
        return self.request("PATCH", path, {"fieldManager": field_manager, "force": "true"}, body, APPLY_PATCH)

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, None, body)

    def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PUT", path, None, body)

    def delete(self, path: str) -> dict[str, Any]:
        return self.request("DELETE", path)


def _warning_text(header: str) -> str:
    """The text of one ``Warning`` header (RFC 7234: ``299 - "text"``)."""
    code, _, rest = header.partition(" ")
    agent, _, text = rest.partition(" ")
    text = text.strip()
    if code.isdigit() and agent and len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return header


def _retry_after(value: str | None) -> float:
    try:
        return min(_MAX_RETRY_AFTER, max(0.1, float(value or 1)))
    except ValueError:
        return 1.0
