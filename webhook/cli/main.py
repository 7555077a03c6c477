"""``gpu-webhook``: serve, certs, check and audit."""

from __future__ import annotations

import argparse
import atexit
import datetime
import math
import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

from webhook import __version__
from webhook.cli import check, formats
from webhook.core.policy import PolicySet
from webhook.core.policyfile import PolicyError, load_policy
from webhook.kube.client import DEFAULT_CREDENTIALS
from webhook.manifests import inputs
from webhook.manifests.parts import UnreadableInput
from webhook.serving import tls
from webhook.serving.ports import port_problem

if TYPE_CHECKING:
    from webhook.audit.loop import LoopSettings

EXIT_USAGE = 2


def _port(text: str) -> int:
    """A TCP port for argparse: 1 to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)")
    return port


def _positive(text: str) -> int:
    """A count for argparse: a whole number, at least 1."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return number


def _seconds(text: str) -> float:
    """A duration for argparse: seconds, 0 or more."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and seconds >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return seconds


# What the exit codes mean, for --help (an epilog) and docs/cli.md (generated from it).
EXIT_CODES = (
    ("0", "success; check and audit found nothing that would be denied"),
    ("1", "check or audit found something that would be denied (with --fail-on warning: or warned about)"),
    ("2", "the arguments, the policy, an input or the cluster could not be used (one line on stderr says which)"),
)
CHECK_EXIT_CODES = (
    ("0", "nothing would be denied (with --fail-on warning: nor warned about)"),
    ("1", "something would be denied (with --fail-on warning: or is warned about)"),
    ("2", "an input or the policy could not be used, or the arguments are wrong (one line on stderr each)"),
)
AUDIT_EXIT_CODES = (
    *CHECK_EXIT_CODES[:2], ("2", "the cluster or the policy could not be used, or the arguments are wrong"),
)


def _epilog(codes: tuple[tuple[str, str], ...]) -> str:
    return "exit codes:\n" + "\n".join(f"  {code}  {meaning}" for code, meaning in codes)


DOCS_URL_VARIABLE = "GPU_WEBHOOK_DOCS_URL"


def _docs_url(text: str) -> str:
    """``--docs-url`` for argparse: an http(s) address, ending in ``/``."""
    scheme, _, rest = text.partition("://")
    if scheme not in ("http", "https") or not rest.strip("/") or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// address")
    return text if text.endswith("/") else text + "/"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-webhook", description="Kubernetes admission webhook for GPU resources.",
        epilog=_epilog(EXIT_CODES), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpu-webhook {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve /validate and /mutate over TLS")
    # Each subcommand's parser rides along in its arguments, so errors found later print its usage.
    serve.set_defaults(subparser=serve)
    serve.add_argument(
        "--host", help="address to listen on (default 0.0.0.0; 127.0.0.1 with --self-signed, which is for trying out)"
    )
    serve.add_argument("--port", type=_port, default=8443, help="port to listen on, 1-65535 (default 8443)")
    serve.add_argument("--cert-file", help="PEM serving certificate (watched; reloaded when it changes)")
    serve.add_argument("--key-file", help="PEM private key of the serving certificate")
    serve.add_argument(
        "--self-signed", action="store_true", help="generate a throw-away CA and certificate for localhost"
    )
    serve.add_argument("--client-ca", help="require client certificates signed by this CA (PEM)")
    serve.add_argument("--policy", help="policy YAML file (watched; default: built-in defaults)")
    serve.add_argument(
        "--policy-object", metavar="NAME",
        help="read the policy live from the cluster-scoped GPUPolicy NAME (the chart passes default): its spec, "
        "watched and checked like a file; while it is missing, --policy or the built-in defaults. One replica "
        "writes its status",
    )
    serve.add_argument(
        "--status-lease", metavar="NAMESPACE/NAME",
        help="with --policy-object: the coordination.k8s.io Lease that elects the replica writing the GPUPolicy's "
        "status (default: <pod namespace>/gpu-webhook-status)",
    )
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    serve.add_argument(
        "--threads", type=int, default=4, help="threads per worker, for request bodies over 256 KiB only (default 4)"
    )
    serve.add_argument(
        "--max-body-bytes", type=_positive, default=7 * 1024 * 1024, help="larger bodies get 413 (default 7 MiB)"
    )
    serve.add_argument(
        "--kubeconfig", help=f"kubeconfig file for the cluster-aware checks (default: {DEFAULT_CREDENTIALS})"
    )
    serve.add_argument(
        "--metrics-port",
        type=_port,
        help="serve GET /metrics over plain HTTP on this port instead of the TLS port; /healthz and /readyz "
        "answer on both",
    )
    serve.add_argument(
        "--drain-seconds", type=_seconds, default=3.0, help="after SIGTERM, fail /readyz this long before stopping"
    )
    serve.add_argument(
        "--audit", action="store_true",
        help="also audit the cluster periodically and write policy reports (a process of its own; one replica "
        "at a time, by a Lease)",
    )
    serve.add_argument("--audit-interval", default="1h", help="time between audits, like 1h or 30m (default 1h)")
    serve.add_argument(
        "--audit-report-kind", choices=["openreports", "wgpolicyk8s"], default="openreports",
        help="openreports.io/v1alpha1 Report (default) or wgpolicyk8s.io/v1alpha2 PolicyReport",
    )
    serve.add_argument(
        "--audit-lease", metavar="NAMESPACE/NAME",
        help="the coordination.k8s.io Lease the replicas share (default: <pod namespace>/gpu-webhook-audit)",
    )
    serve.add_argument(
        "--audit-exclude-namespace", action="append", default=[], metavar="NS",
        help="namespace the audit skips (repeatable), like the webhooks' excluded namespaces",
    )
    serve.add_argument(
        "--audit-resource", action="append", metavar="GROUP/PLURAL",
        help="custom resources to audit, glob patterns like kubeflow.org/pytorchjobs (repeatable; default: every "
        "custom resource the identity may list). Built-in pod kinds are always audited",
    )

    gen = commands.add_parser("certs", help="write a CA and a serving certificate for the webhook Service")
    gen.set_defaults(subparser=gen)
    gen.add_argument("--service", required=True, help="Service name")
    gen.add_argument("--namespace", required=True, help="Service namespace")
    gen.add_argument("--host", action="append", default=[], help="extra SAN (DNS name or IP); repeatable")
    gen.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    gen.add_argument("--out-dir", required=True, help="directory for ca.crt, tls.crt, tls.key")
    gen.add_argument("--force", action="store_true", help="overwrite ca.crt, tls.crt and tls.key if they exist")

    lint = commands.add_parser(
        "check", help="lint manifests offline with the webhook's rules", epilog=_epilog(CHECK_EXIT_CODES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lint.set_defaults(subparser=lint)
    lint.add_argument(
        "--policy",
        help="policy YAML file, or a GPUPolicy alone in one (default: built-in defaults); a GPUPolicy among the PATHs "
        "is checked as a policy, not used as this one",
    )
    lint.add_argument(
        "--namespace", default="default", type=check.namespace_arg,
        help="namespace for objects that name none (default: default)",
    )
    lint.add_argument(
        "--cluster-state", "--nodes", dest="cluster_state", action="append", metavar="FILE",
        help="Nodes, ResourceSlices, DeviceClasses, ResourceClaims, ResourceClaimTemplates and RuntimeClasses "
        f"({inputs.SAVE_CLUSTER_STATE}); turns the cluster-aware checks on and runs them against these; repeatable "
        "(--nodes is the same option)",
    )
    lint.add_argument(
        "-o", "--output", choices=formats.OUTPUTS, default="text",
        help="text lines; json, one document with a summary; jsonl, one JSON object per violation; junit, JUnit "
        "XML; sarif, SARIF 2.1.0",
    )
    lint.add_argument(
        "--fail-on", choices=formats.FAIL_ON, default="deny",
        help="exit 1 when something would be denied (default), or also when something is only warned about",
    )
    lint.add_argument(
        "--docs-url", type=_docs_url, metavar="URL",
        help=f"where the gpu-webhook documentation is published: SARIF links each rule's page there (helpUri); "
        f"default: ${DOCS_URL_VARIABLE}, else no links (each rule's help is in the SARIF itself)",
    )
    lint.add_argument(
        "-R", "--recursive", action="store_true", help="read directories' subdirectories too (as kubectl -R)"
    )
    lint.add_argument(
        "--skip-non-kubernetes", action="store_true",
        help="skip what is not meant as a Kubernetes object instead of refusing it: documents with neither kind nor "
        "apiVersion and metadata (CI files, Helm values, Chart.yaml, package.json), files with no documents, and "
        "Helm chart templates (files under templates/ beside a Chart.yaml: check what helm template renders); "
        "the pre-commit hook's mode",
    )
    lint.add_argument(
        "paths", nargs="+", metavar="PATH", help="YAML or JSON manifest files or directories of them; - for stdin"
    )

    audit = commands.add_parser(
        "audit", help="run the webhook's rules over what a live cluster already runs (read-only: it only lists)",
        epilog=_epilog(AUDIT_EXIT_CODES), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.set_defaults(subparser=audit)
    audit.add_argument(
        "--kubeconfig", help=f"kubeconfig file (default: {DEFAULT_CREDENTIALS})"
    )
    audit.add_argument("--namespace", help="audit this namespace only (default: all namespaces)")
    audit.add_argument("--selector", "-l", help="label selector of the objects to audit, as kubectl -l takes it")
    audit.add_argument(
        "--policy", help="policy YAML file to audit against, deployed or not (default: built-in defaults)"
    )
    audit.add_argument(
        "-o", "--output", choices=["table", "json", "jsonl", "report"], default="table",
        help="a table grouped by namespace and rule, one JSON document with a summary, one JSON object per "
        "violation, or policy reports (YAML)",
    )
    audit.add_argument(
        "--fail-on", choices=formats.FAIL_ON, default="deny",
        help="exit 1 when something would be denied (default), or also when something is only warned about",
    )
    audit.add_argument(
        "--report-kind", choices=["openreports", "wgpolicyk8s"], default="openreports",
        help="with -o report: openreports.io/v1alpha1 Report (default) or wgpolicyk8s.io/v1alpha2 PolicyReport",
    )
    native = commands.add_parser(
        "admission-policies",
        help="write the ValidatingAdmissionPolicies and MutatingAdmissionPolicy the policy's CEL-expressible rules "
        "become (YAML on stdout; the rules that stay with the webhook on stderr)",
    )
    native.set_defaults(subparser=native)
    native.add_argument("--policy", help="policy YAML file (default: built-in defaults)")
    native.add_argument(
        "--apply", action="store_true",
        help="server-side apply them (field manager gpu-webhook) and delete the labelled ones it did not generate",
    )
    native.add_argument("--delete", action="store_true", help="delete every object this command labelled, and exit")
    native.add_argument(
        "--wait", type=float, default=120.0, metavar="SECONDS",
        help="with --apply: wait at most this long until the apiserver enforces every applied policy (a server-side "
        "dry-run probe per policy); exit 2 naming those that never took effect; 0: do not wait (default: 120)",
    )
    native.add_argument(
        "--probe-namespace", default="default", metavar="NAMESPACE",
        help="with --apply: where the dry-run probes are created (default: default)",
    )
    native.add_argument(
        "--kube-version", metavar="VERSION",
        help="without --apply: the Kubernetes version to generate for, as helm's --kube-version (default: the newest "
        "this release knows); with --apply the cluster's own version is used",
    )
    native.add_argument(
        "--api-versions", metavar="GROUP/VERSION[/KIND]", action="append", default=[],
        help="without --apply: an API the cluster serves beyond its version's defaults, as helm's --api-versions "
        "(repeat it, or separate with commas), e.g. admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy",
    )
    native.add_argument(
        "--kubeconfig", help=f"with --apply/--delete: kubeconfig file (default: {DEFAULT_CREDENTIALS})"
    )
    native.add_argument(
        "--crd", action="store_true",
        help="instead of the policies: the CustomResourceDefinition of GPUPolicy, which the policies read live "
        "(nativePolicies.params: live), as YAML on stdout",
    )
    native.add_argument(
        "--versions", action="store_true",
        help="instead of the policies: for this policy, which engine validates and mutates on each Kubernetes "
        "version this release knows and what each leaves to the webhook (a Markdown table on stdout)",
    )
    return parser


def _admission_policies(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.apply and args.delete:
        parser.error("--apply and --delete exclude each other")
    if (args.apply or args.delete) and (args.kube_version or args.api_versions):
        parser.error("--kube-version and --api-versions describe a cluster offline; --apply and --delete ask the "
                     "cluster itself")
    if args.wait < 0:
        parser.error("--wait must be 0 or more seconds")
    if args.versions and (args.apply or args.delete or args.kube_version or args.api_versions):
        parser.error("--versions covers every version: it takes --policy only")
    if args.crd and (args.apply or args.delete or args.versions):
        parser.error("--crd prints the CustomResourceDefinition alone")
    if args.delete:
        from webhook.cli import policies as apply_policies

        return apply_policies.run(None, args.kubeconfig, delete=True)
    if args.crd:
        from webhook.core.policycrd import crd
        from webhook.native.generate import to_yaml

        sys.stdout.write(to_yaml([crd()]))
        return 0
    policies = _policy_or_exit(args.policy)
    if args.versions:
        from webhook.native.generate import versions_table

        sys.stdout.write(versions_table(policies))
        return 0
    if args.apply:
        from webhook.cli import policies as apply_policies

        return apply_policies.run(policies, args.kubeconfig, wait=args.wait, probe_namespace=args.probe_namespace)
    from webhook.cli.policies import report
    from webhook.native.generate import generate, to_yaml
    from webhook.native.target import DEFAULT, TargetError, for_version, known

    api_versions = [v.strip() for item in args.api_versions for v in item.split(",") if v.strip()]
    try:
        target, newer = known(for_version(args.kube_version or DEFAULT.version, api_versions))
    except TargetError as exc:
        print(f"gpu-webhook: admission-policies: {exc}", file=sys.stderr)
        return 2
    if newer:
        print(f"gpu-webhook: admission-policies: {newer}", file=sys.stderr)
    generated = generate(policies, target)
    # Live, the policies read GPUPolicy/default: it goes with them (its CRD comes from --crd).
    extra = [generated.policy_object] if generated.policy_object else []
    sys.stdout.write(to_yaml(generated.objects + extra))
    report(generated, sys.stderr)
    return 0


def _policy_or_exit(path: str | None, serving: bool = False) -> PolicySet:
    """The policy in ``path``; one line naming every bad key and exit 2 when it cannot be used. For ``serve``
    the JSON schema is checked in a child process (``webhook.serving.policies``), so the master, whose modules
    every worker inherits, never imports jsonschema."""
    try:
        if serving:
            from webhook.serving import policies as serving_policies

            return serving_policies.load(path)
        return load_policy(path)
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
    policies = _policy_or_exit(args.policy, serving=True)
    # Workers share counters through files; this must be set before prometheus_client is imported (the audit
    # settings below import webhook.telemetry.metrics with the audit loop).
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", _temp_dir("gpu-webhook-metrics-"))
    audit = None
    if args.audit:
        audit = _audit_settings(args, parser)
    if args.status_lease and not args.policy_object:
        parser.error("--status-lease goes with --policy-object")
    status = None
    if args.policy_object:
        from webhook.serving.policyobject import StatusSettings

        namespace, name = _lease(args.status_lease, "--status-lease", "gpu-webhook-status", parser)
        status = StatusSettings(name=args.policy_object, lease_namespace=namespace, lease_name=name,
                                kubeconfig=args.kubeconfig, policy_file=args.policy)
    if args.audit or args.policy_object or policies.default.cluster_enabled:
        from webhook.kube.client import ConfigError, configuration

        try:
            configuration(args.kubeconfig)  # settings only: a missing or broken kubeconfig stops us here
        except ConfigError as exc:
            needs = "--audit" if args.audit else "--policy-object" if args.policy_object else "cluster.enabled"
            print(f"gpu-webhook: cannot serve: {needs}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    cert_file, key_file = args.cert_file, args.key_file
    host = args.host or ("127.0.0.1" if args.self_signed else "0.0.0.0")
    try:
        if not args.self_signed:
            # ssl alone on the happy path: cryptography, imported here, would stay mapped in every worker.
            tls.server_context(cert_file, key_file, args.client_ca)
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
        from webhook.serving import certs

        paths = certs.write(certs.generate(["localhost", "127.0.0.1", "::1"], days=7), _temp_dir("gpu-webhook-tls-"))
        cert_file, key_file = str(paths["cert"]), str(paths["key"])
        print(f"self-signed CA: {paths['ca']}", flush=True)
        print(f"try: curl --cacert {paths['ca']} https://localhost:{args.port}/healthz", flush=True)
    from webhook.serving.server import ServeConfig, serve

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
        audit=audit.command() if audit is not None else None,
        policy_object=args.policy_object,
        status=status.command() if status is not None else None,
    )
    try:
        serve(config)
    except (OSError, ValueError) as exc:
        print(f"gpu-webhook: cannot serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _audit_settings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> LoopSettings:
    from webhook.audit.loop import LoopSettings, parse_duration

    try:
        interval = parse_duration(args.audit_interval)
    except ValueError as exc:
        parser.error(f"--audit-interval: {exc}")
    if interval < 1:
        parser.error("--audit-interval must be at least 1s")
    namespace, name = _lease(args.audit_lease, "--audit-lease", "gpu-webhook-audit", parser)
    return LoopSettings(
        interval=interval,
        report_kind=args.audit_report_kind,
        lease_namespace=namespace,
        lease_name=name,
        exclude_namespaces=tuple(args.audit_exclude_namespace),
        custom=tuple(args.audit_resource) if args.audit_resource else None,
        kubeconfig=args.kubeconfig,
        policy_file=args.policy,
        policy_object=args.policy_object,
    )


def _lease(value: str | None, flag: str, default: str, parser: argparse.ArgumentParser) -> tuple[str, str]:
    """A Lease's namespace and name: ``value`` (NAMESPACE/NAME), else ``default`` in the pod's namespace."""
    if value:
        namespace, _, name = value.partition("/")
        if not namespace or not name:
            parser.error(f"{flag} takes NAMESPACE/NAME")
        return namespace, name
    try:
        namespace = open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8").read().strip() or "default"
    except OSError:
        namespace = "default"
    return namespace, default


def _certs(args: argparse.Namespace) -> int:
    from webhook.serving import certs

    try:
        hosts = certs.service_names(args.service, args.namespace)
        for host in args.host:
            try:
                hosts.append(certs.san_host(host))
            except certs.CertsError as exc:
                raise certs.CertsError(f"--host {exc}") from None
        certs.validity(args.days, datetime.datetime.now(datetime.UTC))
        certs.targets(args.out_dir, overwrite=args.force)  # refuse before the work, not after it
        paths = certs.write(certs.generate(hosts, days=args.days), args.out_dir, overwrite=args.force)
    except certs.CertsError as exc:
        print(f"gpu-webhook: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for path in paths.values():
        print(path)
    return 0


def _check(args: argparse.Namespace) -> int:
    docs_url = args.docs_url
    if docs_url is None and os.environ.get(DOCS_URL_VARIABLE):
        try:
            docs_url = _docs_url(os.environ[DOCS_URL_VARIABLE])
        except argparse.ArgumentTypeError as exc:
            print(f"gpu-webhook: check: {DOCS_URL_VARIABLE}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    policies = _policy_or_exit(args.policy)
    state = None
    if args.cluster_state:
        try:
            state = inputs.read_cluster_state(args.cluster_state)
        except UnreadableInput as exc:
            print(f"gpu-webhook: --cluster-state: {exc}", file=sys.stderr)
            return check.EXIT_UNREADABLE
        policies = check.with_cluster_checks(policies)
    return check.run(
        args.paths, policies, args.namespace, output=args.output, recursive=args.recursive, cluster_state=state,
        fail_on=args.fail_on, skip_others=args.skip_non_kubernetes, docs_url=docs_url or "", policy_file=args.policy,
    )


def _audit(args: argparse.Namespace) -> int:
    from webhook.cli import audit as auditcmd

    policies = _policy_or_exit(args.policy)
    return auditcmd.run(
        policies, args.kubeconfig, args.namespace, args.selector, args.output, args.report_kind, fail_on=args.fail_on
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args, args.subparser)
    if args.command == "certs":
        return _certs(args)
    if args.command == "audit":
        return _audit(args)
    if args.command == "admission-policies":
        return _admission_policies(args, args.subparser)
    return _check(args)


if __name__ == "__main__":
    sys.exit(main())
