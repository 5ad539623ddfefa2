"""`spectrace doctor`: the config audit before deployment, from config.json files alone."""

from __future__ import annotations

import argparse


def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Register the ``doctor`` subcommand on the ``spectrace`` parser."""
    return None
