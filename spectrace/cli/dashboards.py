"""`spectrace dashboards export|push`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from spectrace.redact import redact


def _profile(args: argparse.Namespace):
    from spectrace.dashboards import alerts

    return alerts.profile(args.profile)


def cmd_export(args: argparse.Namespace) -> int:
    from spectrace.console import UsageError
    from spectrace.dashboards.export import ExportError, ExportOptions, export

    options = ExportOptions(
        profile=_profile(args),
        datasource_uid=args.datasource_uid,
        prometheus_url=args.prometheus_url,
        provisioning_path=args.provisioning_path.rstrip("/") or "/",
    )
    try:
        written = export(args.dir, options)
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    root = Path(args.dir)
    for path in written:
        print(path.relative_to(root))
    print(f"wrote {len(written)} files under {root} ({options.profile.name} profile)")
    return 0


def _token(args: argparse.Namespace) -> str | None:
    from spectrace.console import UsageError

    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {args.token_file}: {exc.strerror or exc}") from None
        if not token:
            raise UsageError(f"--token-file {args.token_file} is empty")
        return token
    return os.environ.get("GRAFANA_TOKEN") or None


def cmd_push(args: argparse.Namespace) -> int:
    from urllib.parse import urlparse

    from spectrace.console import UsageError
    from spectrace.dashboards.push import PushError, push

    token = _token(args)
    if token is None and not (urlparse(args.url).username and urlparse(args.url).password):
        raise UsageError("no Grafana credentials: set GRAFANA_TOKEN or pass --token-file FILE")
    try:
        result = push(args.url, token, profile=_profile(args), datasource_uid=args.datasource_uid, timeout=args.timeout)
    except PushError as exc:
        raise UsageError(str(exc)) from None
    for line in result.lines():
        print(line)
    print(f"pushed to Grafana {result.grafana_version} at {redact(args.url.rstrip('/'))}")
    return 0


def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Register the ``dashboards`` subcommand on the ``spectrace`` parser."""
    from spectrace.dashboards.alerts import EXAMPLE_DATASOURCE_UID, PROFILES

    dashboards = sub.add_parser(
        "dashboards",
        help="Grafana dashboards and alert rules (export a provisioning tree, or push to a Grafana)",
        description="Grafana dashboards and alert rules for speculative decoding.",
    )
    commands = dashboards.add_subparsers(dest="dashboards_command", required=True)
    profile_help = "rule windows and durations: production (default) or test (seconds, for tests)"

    export = commands.add_parser(
        "export", help="write a Grafana/Prometheus provisioning tree into DIR",
        description="Write dashboards, a dashboard provider, Grafana alert rules, an example Prometheus data source, "
                    "the Prometheus rule file and an example Alertmanager route into DIR.",
    )
    export.add_argument("dir", metavar="DIR", help="output directory (created if missing)")
    export.add_argument("--profile", choices=sorted(PROFILES), default="production", help=profile_help)
    export.add_argument("--datasource-uid", default=EXAMPLE_DATASOURCE_UID,
                        help=f"uid of the Prometheus data source the alert rules query (default: {EXAMPLE_DATASOURCE_UID}, "
                             "the example data source)")
    export.add_argument("--prometheus-url", default="http://localhost:9090", help="URL of the example data source")
    export.add_argument("--provisioning-path", default="/etc/grafana/provisioning",
                        help="where grafana/provisioning will be mounted (default: /etc/grafana/provisioning)")
    export.set_defaults(func=cmd_export)

    push = commands.add_parser(
        "push", help="create or update the folder, dashboards and alert rules in a Grafana",
        description="Create or update the Spectrace folder, both dashboards and the alert rule group through "
                    "Grafana's HTTP API. Idempotent. The token comes from GRAFANA_TOKEN or --token-file.",
    )
    push.add_argument("--url", required=True, help="Grafana base URL, e.g. http://localhost:3000")
    push.add_argument("--token-file", help="file holding a service-account token (default: $GRAFANA_TOKEN)")
    push.add_argument("--datasource-uid", help="Prometheus data source for the alert rules "
                      "(default: the only, or the default, Prometheus data source)")
    push.add_argument("--profile", choices=sorted(PROFILES), default="production", help=profile_help)
    push.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default: 10)")
    push.set_defaults(func=cmd_push)
