"""One redaction for every boundary where spectrace echoes text it was given or got back: logs,
errors, records, span attributes, CLI output.

``redact(text)`` hides a connection string's password (libpq ``key=value`` and URI forms,
``PGPASSWORD``-style fields), a URL's password, and bearer / basic credentials and Grafana
service-account tokens. It never raises and leaves everything else as it was, so a redacted
error still says what went wrong.
"""

from __future__ import annotations

import re

MASK = "***"

# key=value (libpq, ODBC-style, query strings): password=..., PGPASSWORD=..., token=..., api_key=...
_KEY_VALUE = re.compile(
    r"""(?ix)
    \b((?:pg)?pass(?:word|wd)?|pwd|sslpassword|secret|token|api[_-]?key|access[_-]?key)
    (\s*[=:]\s*)
    ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s;,&'"]+)
    """
)
# scheme://user:password@host -> scheme://user:***@host
_URI_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/@\s:]*):([^/@\s]*)@")
_AUTHORIZATION = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")
_GRAFANA_TOKEN = re.compile(r"\bglsa_[A-Za-z0-9_]{8,}")


def redact(text: object) -> str:
    """``text`` (any object, as ``str``) with every secret it holds replaced by ``***``."""
    try:
        out = str(text)
    except Exception:
        return MASK
    out = _URI_PASSWORD.sub(lambda m: f"{m.group(1)}:{MASK}@", out)
    out = _KEY_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", out)
    out = _AUTHORIZATION.sub(lambda m: f"{m.group(1)} {MASK}", out)
    return _GRAFANA_TOKEN.sub(MASK, out)
