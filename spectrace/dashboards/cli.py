"""`spectrace dashboards export|push`."""

from __future__ import annotations

import argparse


def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Register the ``dashboards`` subcommand on the ``spectrace`` parser."""
    return None
