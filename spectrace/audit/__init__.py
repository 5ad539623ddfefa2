"""The audit: pure functions that turn captured config and layout into findings."""

from spectrace.audit.layout import *  # noqa: F401,F403
