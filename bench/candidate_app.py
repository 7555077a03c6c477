"""The webhook's Flask app with the default policy, as a plain WSGI callable for other servers to serve
(``bench/candidates.py`` measures them against ours): ``bench.candidate_app:app``."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="gpu-webhook-candidate-metrics-"))

from webhook.core.policyfile import load_policy  # noqa: E402
from webhook.rules.admission import allow_all  # noqa: E402
from webhook.serving.app import DEFAULT_HANDLERS, create_app  # noqa: E402

_policy = load_policy(None)
app = create_app(lambda: _policy, lambda: None, handlers={**DEFAULT_HANDLERS, "/noop": allow_all})
