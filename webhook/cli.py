"""``gpu-webhook``: serve, certs and check."""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile

from webhook import __version__, certs, check, tls
from webhook.connections import port_problem
from webhook.policy import PolicyError, load_policy

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-webhook", description="Kubernetes admission webhook for GPU resources.")
    parser.add_argument("--version", action="version", version=f"gpu-webhook {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve /validate and /mutate over TLS")
    serve.add_argument(
        "--host", help="address to listen on (default 0.0.0.0; 127.0.0.1 with --self-signed, which is for trying out)"
    )
    serve.add_argument("--port", type=int, default=8443, help="port to listen on (default 8443)")
    serve.add_argument("--cert-file", help="PEM serving certificate (watched; reloaded when it changes)")
    serve.add_argument("--key-file", help="PEM private key of the serving certificate")
    serve.add_argument(
        "--self-signed", action="store_true", help="generate a throw-away CA and certificate for localhost"
    )
    serve.add_argument("--client-ca", help="require client certificates signed by this CA (PEM)")
    serve.add_argument("--policy", help="policy YAML file (watched; default: built-in defaults)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    serve.add_argument(
        "--threads", type=int, default=4, help="handler threads per worker, for complete requests only (default 4)"
    )
    serve.add_argument(
        "--max-body-bytes", type=int, default=7 * 1024 * 1024, help="larger bodies get 413 (default 7 MiB)"
    )
    serve.add_argument(
        "--kubeconfig", help="kubeconfig for cluster-aware checks (default: the in-cluster service account)"
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        help="serve GET /metrics, /healthz and /readyz over plain HTTP on this port instead of the TLS port",
    )
    serve.add_argument(
        "--drain-seconds", type=float, default=3.0, help="after SIGTERM, fail /readyz this long before stopping"
    )

    gen = commands.add_parser("certs", help="write a CA and a serving certificate for the webhook Service")
    gen.add_argument("--service", required=True, help="Service name")
    gen.add_argument("--namespace", required=True, help="Service namespace")
    gen.add_argument("--host", action="append", default=[], help="extra SAN (DNS name or IP); repeatable")
    gen.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    gen.add_argument("--out-dir", required=True, help="directory for ca.crt, tls.crt, tls.key")

    lint = commands.add_parser("check", help="lint manifests offline with the webhook's rules")
    lint.add_argument("--policy", help="policy YAML file (default: built-in defaults)")
    lint.add_argument("--namespace", default="default", help="namespace for objects that name none (default: default)")
    lint.add_argument(
        "--cluster-state", "--nodes", dest="cluster_state", action="append", metavar="FILE",
        help="Nodes, ResourceSlices, DeviceClasses, ResourceClaims, ResourceClaimTemplates and RuntimeClasses "
        "(kubectl get nodes,resourceslices,deviceclasses -o yaml) to run the cluster-aware checks against; "
        "repeatable (--nodes is the old name)",
    )
    lint.add_argument("paths", nargs="+", metavar="PATH", help="YAML or JSON manifest files; - for stdin")
    return parser


def _policy_or_exit(path: str | None) -> None:
    try:
        load_policy(path)
    except PolicyError as exc:
        print(f"gpu-webhook: {exc}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _temp_dir(prefix: str) -> str:
    """A directory removed when the process that made it exits, and only then.

    gunicorn forks workers that inherit atexit handlers: without the owner check a worker that exits
    (a timeout, a respawn) would delete the directory the master and the other workers still use.
    """
    path = tempfile.mkdtemp(prefix=prefix)
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)
    return path


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.self_signed == bool(args.cert_file or args.key_file):
        parser.error("serve needs either --self-signed or both --cert-file and --key-file")
    if not args.self_signed and not (args.cert_file and args.key_file):
        parser.error("--cert-file and --key-file go together")
    if args.workers < 1 or args.threads < 1:
        parser.error("--workers and --threads must be at least 1")
    _policy_or_exit(args.policy)
    cert_file, key_file = args.cert_file, args.key_file
    host = args.host or ("127.0.0.1" if args.self_signed else "0.0.0.0")
    try:
        if not args.self_signed:
            tls.check_files(cert_file, key_file, args.client_ca)
        elif args.client_ca:
            tls.check_ca(args.client_ca)
    except tls.TLSFileError as exc:
        print(f"gpu-webhook: cannot serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    problem = port_problem(host, args.port)
    if args.metrics_port is not None:
        if args.metrics_port == args.port:
            problem = problem or "--metrics-port must differ from --port"
        problem = problem or port_problem(host, args.metrics_port)
    if problem:
        print(f"gpu-webhook: cannot serve: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.self_signed:
        paths = certs.write(certs.generate(["localhost", "127.0.0.1", "::1"], days=7), _temp_dir("gpu-webhook-tls-"))
        cert_file, key_file = str(paths["cert"]), str(paths["key"])
        print(f"self-signed CA: {paths['ca']}", flush=True)
        print(f"try: curl --cacert {paths['ca']} https://localhost:{args.port}/healthz", flush=True)
    # Workers share counters through files; this must be set before prometheus_client is imported.
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", _temp_dir("gpu-webhook-metrics-"))
    from webhook.server import ServeConfig, serve

    config = ServeConfig(
        cert_file=cert_file,
        key_file=key_file,
        host=host,
        port=args.port,
        policy_file=args.policy,
        client_ca=args.client_ca,
        workers=args.workers,
        threads=args.threads,
        max_body=args.max_body_bytes,
        kubeconfig=args.kubeconfig,
        drain_seconds=args.drain_seconds,
        metrics_port=args.metrics_port,
    )
    try:
        serve(config)
    except (OSError, ValueError) as exc:
        print(f"gpu-webhook: cannot serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _certs(args: argparse.Namespace) -> int:
    if args.days < 1:
        print("gpu-webhook: --days must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    hosts = certs.service_names(args.service, args.namespace) + args.host
    paths = certs.write(certs.generate(hosts, days=args.days), args.out_dir)
    for path in paths.values():
        print(path)
    return 0


def _check(args: argparse.Namespace) -> int:
    try:
        policies = load_policy(args.policy)
    except PolicyError as exc:
        print(f"gpu-webhook: {exc}", file=sys.stderr)
        return check.EXIT_UNREADABLE
    state = None
    if args.cluster_state:
        try:
            state = check.read_cluster_state(args.cluster_state)
        except check.UnreadableInput as exc:
            print(f"gpu-webhook: {', '.join(args.cluster_state)}: {exc}", file=sys.stderr)
            return check.EXIT_UNREADABLE
    return check.run(args.paths, policies, args.namespace, cluster_state=state)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args, parser)
    if args.command == "certs":
        return _certs(args)
    return _check(args)


if __name__ == "__main__":
    sys.exit(main())
