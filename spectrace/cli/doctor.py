"""The ``spectrace doctor`` subcommand: arguments, exit codes, text or JSON output.

Exit code 0: no error finding; 1: at least one; 2: bad input (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from spectrace.console import UsageError, safe
from spectrace.doctor.diagnose import DEFAULT_K, DEFAULT_RUNNER, diagnose
from spectrace.doctor.inputs import DoctorInputError
from spectrace.doctor.render import render_text


def cmd_doctor(args: argparse.Namespace) -> int:
    if not args.target:
        raise UsageError("doctor needs --target PATH (a model directory with config.json)")
    if not args.draft:
        raise UsageError("doctor needs --draft PATH (a model directory with config.json)")
    try:
        report = diagnose(
            args.target,
            args.draft,
            method=args.method,
            num_speculative_tokens=args.num_speculative_tokens,
            runner=args.runner,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            speculative_config=args.speculative_config,
        )
    except DoctorInputError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        json.dump(report.as_dict(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report))
    return 1 if report.has_error else 0


def _one_line_error(message: str) -> NoReturn:
    """argparse's error for doctor's arguments: it quotes what was typed (an ambiguous ``--max=VALUE`` whole), so
    through the one boundary before a terminal (``console.safe``), secrets redacted, as ``cli.main``'s line."""
    from spectrace.redact import redact

    print(f"spectrace: error: doctor: {safe(redact(message))}", file=sys.stderr)
    sys.exit(2)


def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Register the ``doctor`` subcommand on the ``spectrace`` parser."""
    parser = sub.add_parser(
        "doctor",
        help="audit a target + drafter pair from config.json files alone (no GPU, no weights)",
        description=(
            "Before deployment: run the installed vLLM's config resolution and layer-layout rules on "
            "the target's and the drafter's config.json (no weights, no tokenizer, no engine) and report "
            "the findings a live run would. Exit 0: no error; 1: at least one error finding; 2: bad input."
        ),
    )
    parser.add_argument("--target", metavar="PATH", help="target model directory (config.json is enough)")
    parser.add_argument("--draft", metavar="PATH", help="drafter model directory (config.json is enough)")
    parser.add_argument("--method", help="speculative method as given to vLLM (default: let vLLM infer it, as it would)")
    parser.add_argument(
        "--num-speculative-tokens", metavar="K", help=f"draft tokens per step (default {DEFAULT_K})"
    )
    parser.add_argument(
        "--runner",
        default=DEFAULT_RUNNER,
        metavar="v1|v2",
        help="whose rules apply: v2 (default; vLLM 0.32's default on CUDA) or v1 (the CPU build's)",
    )
    parser.add_argument("--max-model-len", metavar="N", help="as vLLM's --max-model-len (default: derived by vLLM)")
    parser.add_argument("--max-num-seqs", metavar="N", help="as vLLM's --max-num-seqs (default: vLLM's)")
    parser.add_argument("--max-num-batched-tokens", metavar="N",
                        help="as vLLM's --max-num-batched-tokens (default: vLLM's); checked against max-num-seqs x (1 + k)")
    parser.add_argument("--speculative-config", metavar="JSON",
                        help='further keys of vLLM\'s --speculative-config, e.g. \'{"rejection_sample_method": "synthetic", '
                        '"synthetic_acceptance_length": 2.5}\' (model, method and k: the options above)')
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=cmd_doctor)
    parser.error = _one_line_error  # type: ignore[method-assign]
