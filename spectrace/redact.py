"""One redaction for every boundary where spectrace echoes text it was given or got back: logs,
errors, records, span attributes, CLI output.

Two layers, both in ``redact(text)``:

- **Secrets the process knows of.** ``remember(text)`` parses a connection string or URL it
  is given (a lake catalog in libpq ``key=value`` or URI form, a Grafana URL; ``remember_token``: a bare token) and
  keeps its passwords and tokens; ``redact`` then replaces each of them wherever it appears,
  in whatever form a library prints it (DuckDB echoing a catalog as a file path, libpq
  quoting it, a URL with the password percent-encoded or decoded). The lake's ``connect``, the
  Grafana push and the CLI (its arguments and the variables that carry secrets) remember
  theirs, so no message can echo them, whoever formats it.
- **Secret shapes**, for text that carries secrets the process was never given: a
  ``password=``/``PGPASSWORD``-style field (a libpq value runs to the next blank: ``;``,
  ``&`` and ``,`` are part of it; in a URL's query string it ends at ``&``), a URL's
  password (``scheme://user:pw@`` and the ``scheme:/user:pw@`` that file-path
  normalisation makes of it), bearer / basic credentials and Grafana service-account tokens.

``redact`` never raises and leaves everything else as it was, so a redacted error still says
what went wrong. ``RedactingFilter`` applies it to every record of spectrace's loggers.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import parse_qsl, quote, unquote, urlsplit

MASK = "***"
MIN_SECRET = 3  # a remembered secret shorter than this is masked only where its field is (a shape below)

_SECRET_KEYS = r"(?:pg)?pass(?:word|wd)?|pwd|sslpassword|secret|token|api[_-]?key|access[_-]?key"
_IS_SECRET_KEY = re.compile(rf"(?i)^(?:{_SECRET_KEYS})$")

# key=value in a URL's query string: the value ends at & or #
_QUERY_VALUE = re.compile(rf"(?ix)([?&](?:{_SECRET_KEYS}))(=)([^&#\s'\"]*)")
# key=value anywhere else (libpq, ODBC-style, KEY=VALUE): quoted, or up to the next blank or quote
_KEY_VALUE = re.compile(
    rf"""(?ix)
    (?<![?&\w])({_SECRET_KEYS})
    (\s*[=:]\s*)
    ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s'"]+)
    """
)
# scheme://user:password@host and scheme:/user:password@host -> scheme://user:***@host
_URI_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*:/{1,2}[^/@\s:]*):([^/@\s]*)@")
_AUTHORIZATION = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")
_GRAFANA_TOKEN = re.compile(r"\bglsa_[A-Za-z0-9_]{8,}")
# libpq key=value: key = 'quoted \' value' | key = value-to-the-next-blank
_LIBPQ_PAIR = re.compile(r"""(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)""")

_known: set[str] = set()
_pattern: re.Pattern | None = None
_lock = threading.Lock()


def _forms(secret: str) -> set[str]:
    """The ways a library may print ``secret``: as given, percent-decoded and -encoded, escaped."""
    forms = {secret, unquote(secret), quote(secret, safe=""), secret.replace("'", "''"), secret.replace("\\", "\\\\")}
    return {f for f in forms if len(f) >= MIN_SECRET}


def secrets_in(text: str) -> set[str]:
    """The passwords and tokens a connection string, URL or credential holds (libpq ``key=value``,
    URIs with ``user:password@`` or ``?password=``; ``remember_token`` takes a bare token)."""
    found: set[str] = set()
    text = (text or "").strip()
    if not text:
        return found
    for match in re.finditer(r"[a-z][a-z0-9+.-]*:/{1,2}\S+", text, flags=re.IGNORECASE):
        url = match.group(0) if "://" in match.group(0) else match.group(0).replace(":/", "://", 1)
        try:
            parts = urlsplit(url)
            found.add(parts.password or "")
            found.update(value for key, value in parse_qsl(parts.query) if _IS_SECRET_KEY.match(key))
        except ValueError:  # not a URL after all (a bad port, brackets): the shapes below still apply
            pass
    for key, value in _LIBPQ_PAIR.findall(text):
        if _IS_SECRET_KEY.match(key) and value:
            if len(value) >= 2 and value[0] == value[-1] == "'":
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            found.add(value)
    return {s for s in found if s}


def remember(*texts: object) -> None:
    """Keep the secrets each connection string or URL in ``texts`` holds (``secrets_in``):
    ``redact`` masks them wherever they appear from now on, in this process."""
    _keep({secret for text in texts if text for secret in secrets_in(str(text))})


def remember_token(token: object) -> None:
    """Keep ``token`` (a bearer token, a password on its own) as a secret, whole."""
    if token and str(token).strip():
        _keep({str(token).strip()})


def _keep(secrets: set[str]) -> None:
    global _pattern
    install_logging_filter()  # a process that knows a secret logs nothing that holds it
    new = {form for secret in secrets for form in _forms(secret)}
    with _lock:
        if new - _known:
            _known.update(new)
            ordered = sorted(_known, key=len, reverse=True)  # the longest first: no partial mask of a longer one
            _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def forget() -> None:
    """Drop every remembered secret (tests)."""
    global _pattern
    with _lock:
        _known.clear()
        _pattern = None


def redact(text: object) -> str:
    """``text`` (any object, as ``str``) with every secret it holds replaced by ``***``."""
    try:
        out = str(text)
    except Exception:
        return MASK
    try:
        pattern = _pattern
        if pattern is not None:
            out = pattern.sub(MASK, out)
        out = _URI_PASSWORD.sub(lambda m: f"{m.group(1)}:{MASK}@", out)
        out = _QUERY_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", out)
        out = _KEY_VALUE.sub(lambda m: m.group(0) if m.group(3) == MASK else f"{m.group(1)}{m.group(2)}{MASK}", out)
        out = _AUTHORIZATION.sub(lambda m: f"{m.group(1)} {MASK}", out)
        return _GRAFANA_TOKEN.sub(MASK, out)
    except Exception:
        return MASK


class RedactingFilter(logging.Filter):
    """A logging filter that redacts a record's message and its exception text (attached to
    spectrace's loggers: every line spectrace logs, whoever handles it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True  # a broken format: logging reports it as it would
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


LOGGERS = ("vllm.spectrace", "spectrace", "spectrace.store")


def install_logging_filter() -> None:
    """Attach ``RedactingFilter`` to spectrace's loggers, once: where tracing starts (the runtime), in the
    ``spectrace`` command, and wherever a secret is remembered (never at import: with tracing off the plugin
    imports nothing but itself and the settings)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
