"""The server under test: the production stack (``webhook.serving.server.serve``: gunicorn's master with
``AsyncWorker``s on uvloop, TLS, metrics, decision logs) with the real handlers plus ``/noop``
(``webhook.rules.admission.allow_all``) as the floor.

    python -m bench.server --cert-file tls.crt --key-file tls.key --port 9443 [--workers 1] [--source DIR]

``--source DIR`` imports ``webhook`` from another tree (a patched copy) to measure a proposed fix.
``--gc-log FILE`` appends one line per full (generation 2) garbage collection: pid, milliseconds.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time


def log_full_collections(path: str) -> None:
    """Time every generation-2 collection; forked workers inherit the callback."""
    started: list[float] = []

    def callback(phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            with open(path, "a") as out:
                out.write(f"{os.getpid()} {(time.perf_counter() - started[0]) * 1000:.3f}\n")

    gc.callbacks.append(callback)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server")
    parser.add_argument("--cert-file", required=True)
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=8, help="the worker's pool, for bodies over 256 KiB only")
    parser.add_argument("--policy")
    parser.add_argument("--source", help="directory holding the webhook package to serve (default: this checkout)")
    parser.add_argument("--gc-log", help="append the duration of every full garbage collection to this file")
    args = parser.parse_args(argv)
    if args.gc_log:
        log_full_collections(args.gc_log)
    if args.source:
        sys.path.insert(0, os.path.abspath(args.source))
    # As webhook/cli.py does: metrics are shared through files, set before prometheus_client is imported.
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="gpu-webhook-bench-metrics-"))
    import webhook
    from webhook.rules.admission import allow_all
    from webhook.serving.app import DEFAULT_HANDLERS
    from webhook.serving.server import ServeConfig, serve

    print(f"serving webhook from {os.path.dirname(webhook.__file__)}", file=sys.stderr, flush=True)
    config = ServeConfig(
        cert_file=args.cert_file,
        key_file=args.key_file,
        host=args.host,
        port=args.port,
        policy_file=args.policy,
        workers=args.workers,
        threads=args.threads,
        drain_seconds=0.0,
    )
    serve(config, {**DEFAULT_HANDLERS, "/noop": allow_all})
    return 0


if __name__ == "__main__":
    sys.exit(main())
