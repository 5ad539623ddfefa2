"""``spectrace dashboards push``: the folder, dashboards and alert rule group into a Grafana, over its HTTP API.

Idempotent: the folder is created only when missing, dashboards are saved with
``overwrite``, and the rule group is replaced as a whole (PUT), so a second push
changes nothing. Every failure becomes one ``PushError`` line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urljoin, urlparse

from spectrace.redact import redact, remember, remember_token
from spectrace.dashboards import alerts, build


class PushError(Exception):
    """A one-line reason the push failed."""


@dataclass
class PushResult:
    grafana_version: str
    folder_created: bool
    dashboards: list[str] = field(default_factory=list)  # URLs (or uids) of the saved dashboards
    rule_group: str = alerts.GROUP
    rules: int = 0
    datasource_uid: str = ""

    def lines(self) -> list[str]:
        return [
            f"folder {alerts.FOLDER_TITLE!r} ({alerts.FOLDER_UID}): {'created' if self.folder_created else 'exists'}",
            *(f"dashboard: {d}" for d in self.dashboards),
            f"alert rule group {self.rule_group!r}: {self.rules} rules on data source {self.datasource_uid}",
        ]


def _first_line(value: Any, limit: int = 200) -> str:
    text = value.get("message", "") if isinstance(value, dict) else str(value or "")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _unreachable_reason(exc: Exception) -> str:
    text = str(exc)
    if m := re.search(r"Failed to resolve '([^']+)'", text):
        return f"cannot resolve host {m.group(1)}"
    if m := re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text):
        return m.group(1).strip()
    if "timed out" in text.lower():
        return "timed out"
    return _first_line(text, 120) or type(exc).__name__


def check_url(url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PushError(f"not a Grafana URL: {redact(url)!r} (expected http(s)://host[:port][/path])")


class _Grafana:
    """grafana-client calls, each turned into a PushError line on failure."""

    def __init__(self, url: str, credential: Any, timeout: float) -> None:
        try:
            from grafana_client import GrafanaApi
        except ImportError:
            raise PushError("spectrace dashboards push needs grafana-client: pip install 'spectrace[dashboards]'") from None
        self.url = redact(url.rstrip("/"))  # what messages and results name: never the URL's password
        self.timeout = timeout
        self.api = GrafanaApi.from_url(url, credential=credential, timeout=timeout)

    def call(self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False, **kwargs: Any) -> Any:
        """Run ``fn``; with ``missing_ok`` a 404 returns None."""
        import niquests.exceptions
        from grafana_client.client import (
            GrafanaBadInputError,
            GrafanaClientError,
            GrafanaException,
            GrafanaServerError,
            GrafanaTimeoutError,
            GrafanaUnauthorizedError,
        )

        try:
            return fn(*args, **kwargs)
        except GrafanaUnauthorizedError:
            raise PushError(
                f"Grafana at {self.url} rejected the credentials (401 Unauthorized) while trying to {what}: "
                "check GRAFANA_TOKEN or --token-file"
            ) from None
        except GrafanaBadInputError as exc:
            raise PushError(f"Grafana rejected the request to {what} (400 Bad Request): {_first_line(exc.response)}") from None
        except GrafanaTimeoutError:
            raise PushError(f"Grafana at {self.url} did not answer within {self.timeout:g}s (while trying to {what})") from None
        except GrafanaClientError as exc:
            if exc.status_code == 404 and missing_ok:
                return None
            if exc.status_code == 403:
                raise PushError(
                    f"the token may not {what} (403 Forbidden): it needs the Editor role, or Admin for alert rules"
                ) from None
            raise PushError(f"Grafana refused to {what} ({exc.status_code}): {_first_line(exc.response)}") from None
        except GrafanaServerError as exc:
            raise PushError(f"Grafana failed to {what} ({exc.status_code}): {_first_line(exc.response)}") from None
        except (niquests.exceptions.JSONDecodeError, ValueError):  # something other than Grafana answers
            raise PushError(f"{self.url} does not answer like Grafana (no JSON from its API while trying to {what})") from None
        except (GrafanaException, niquests.exceptions.RequestException) as exc:  # transport errors
            raise PushError(f"cannot reach Grafana at {self.url}: {_unreachable_reason(exc)}") from None


def _pick_datasource(grafana: _Grafana, uid: str | None) -> str:
    if uid:
        found = grafana.call(f"read data source {uid}", grafana.api.datasource.get_datasource_by_uid, uid, missing_ok=True)
        if not found:
            raise PushError(f"Grafana has no data source with uid {uid!r}")
        return uid
    sources = grafana.call("list data sources", grafana.api.datasource.list_datasources) or []
    prometheus = [s for s in sources if s.get("type") == "prometheus"]
    if not prometheus:
        raise PushError("Grafana has no Prometheus data source: add one, or pass --datasource-uid")
    if len(prometheus) == 1:
        return prometheus[0]["uid"]
    default = [s for s in prometheus if s.get("isDefault")]
    if default:
        return default[0]["uid"]
    names = ", ".join(f"{s.get('name')} ({s.get('uid')})" for s in prometheus)
    raise PushError(f"several Prometheus data sources ({names}): choose one with --datasource-uid")


def push(
    url: str,
    credential: Any,
    *,
    profile: "str | alerts.Profile" = alerts.PRODUCTION,
    datasource_uid: str | None = None,
    timeout: float = 10.0,
) -> PushResult:
    """Create or update the spectrace folder, both dashboards and the alert rule group.

    ``credential``: a service-account token, or (user, password); None uses
    ``user:password@`` from the URL.
    """
    remember(url)  # no message names the URL's password or the token, whoever formats it
    if isinstance(credential, str):
        remember_token(credential)
    elif isinstance(credential, tuple) and len(credential) == 2:
        remember_token(credential[1])
    check_url(url)
    try:
        documents = list(build.dashboards().values())
    except ImportError as exc:
        raise PushError(str(exc)) from None
    grafana = _Grafana(url, credential, timeout)
    health = grafana.call("check its health", grafana.api.client.GET, "/health")
    if not isinstance(health, dict) or "version" not in health:
        raise PushError(f"{grafana.url} does not answer like Grafana (GET /api/health has no version)")
    # an authenticated call first, so a bad token fails before anything is written
    folder = grafana.call("read the spectrace folder", grafana.api.folder.get_folder, alerts.FOLDER_UID, missing_ok=True)
    datasource = _pick_datasource(grafana, datasource_uid)
    result = PushResult(grafana_version=str(health["version"]), folder_created=folder is None, datasource_uid=datasource)
    if folder is None:
        grafana.call("create the spectrace folder", grafana.api.folder.create_folder, alerts.FOLDER_TITLE, uid=alerts.FOLDER_UID)

    for document in documents:
        payload = {
            "dashboard": {**document, "id": None},
            "folderUid": alerts.FOLDER_UID,
            "overwrite": True,
            "message": "spectrace dashboards push",
        }
        saved = grafana.call(f"save dashboard {document['uid']}", grafana.api.dashboard.update_dashboard, payload)
        where = saved.get("url") if isinstance(saved, dict) else None
        result.dashboards.append(urljoin(grafana.url + "/", where) if where else document["uid"])

    try:
        group = alerts.grafana_rule_group(profile, datasource, alerts.FOLDER_UID)
    except ImportError as exc:
        raise PushError(str(exc)) from None
    grafana.call(
        f"save alert rule group {alerts.GROUP}",
        grafana.api.alertingprovisioning.update_rule_group,
        alerts.FOLDER_UID,
        alerts.GROUP,
        group,
    )
    result.rules = len(group["rules"])
    return result
