"""The ``spectrace probe`` subcommand: serve the pair under each reading a finding doubts, say which one accepts.

Exit code 0: no candidate beats the served reading beyond the interval; 1: one does (``PROBE_BETTER_READING``);
2: bad input, or nothing could be served (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from spectrace.cli.args import default_dir
from spectrace.console import UsageError


def _engine_args(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--engine-arg {pair!r}: give KEY=VALUE (VALUE as JSON, else a string)")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except ValueError:
            out[key.replace("-", "_")] = value
    return out


def _positive(text: str | None, name: str, default: int) -> int:
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{name} must be an integer, not {text!r}") from None


def cmd_probe(args: argparse.Namespace) -> int:
    from spectrace.probe import run as probe_run

    if not args.target or not args.draft or not args.method:
        raise UsageError("probe needs --target PATH, --draft PATH and --method M (as given to vLLM)")
    engine = _engine_args(args.engine_arg or [])
    if args.dtype:
        engine["dtype"] = args.dtype
    if args.max_model_len:
        engine["max_model_len"] = _positive(args.max_model_len, "--max-model-len", 0)
    families = tuple(f.strip() for f in args.readings.split(",") if f.strip())
    try:
        probe = probe_run.Probe(
            target=args.target, draft=args.draft, method=args.method, prompts=probe_run.read_prompts(args.prompts),
            k=_positive(args.k, "--k", probe_run.DEFAULT_K),
            max_tokens=_positive(args.max_tokens, "--max-tokens", probe_run.DEFAULT_MAX_TOKENS),
            families=families, runner=args.runner, engine=engine, label=args.draft)
        say = (lambda text: print(text, file=sys.stderr, flush=True)) if args.json else (lambda text: print(text, flush=True))
        (result,) = probe_run.run([probe], store=None if args.no_store else Path(args.dir), say=say,
                                  log=Path(args.log) if args.log else None)
    except probe_run.ProbeInputError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        json.dump(as_dict(result), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(result))
    if not any(o.status == "ok" for o in result.outcomes):
        served = result.outcome("served")
        raise UsageError(f"no reading could be served; as served: {served.error}")
    return 1 if result.verdict.beats_served else 0


def as_dict(result: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "probe_id": result.probe_id, "verdict": result.verdict.text, "best": result.verdict.best,
        "beats_served": result.verdict.beats_served, "delta": result.verdict.delta,
        "delta_half_width": result.verdict.half_width, "engines": result.engines, "tokens": result.tokens,
        "seconds": round(result.seconds, 1), "not_probed": result.not_probed,
        "candidates": [{"name": o.candidate.name, "kind": o.candidate.kind, "source": o.candidate.source,
                        "reading": o.candidate.reading, "patch": o.candidate.patch, "taps": o.candidate.taps,
                        "status": o.status, "error": o.error, "run_id": o.run_id, "tokens_per_s": o.tokens_per_s,
                        "summary": asdict(o.summary) if o.summary else None,
                        "delta": result.verdict.deltas.get(o.candidate.name)} for o in result.outcomes],
        "findings": [{"code": f.code, "severity": f.severity, "message": f.message, "fix": f.fix,
                      "evidence": f.evidence} for f in result.findings],
    }


def render(result: Any) -> str:
    p = result.probe
    lines = [f"probe {result.probe_id}: {p.draft} on {p.target} ({p.method}, k = {p.k}, {len(p.prompts)} prompts × "
             f"{p.max_tokens} tokens, greedy)", ""]
    lines.append(f"  {'reading':26} {'acceptance (95 % interval)':28} {'per position':20} {'length':>6} {'tok/s':>7}  vs served")
    for o in result.outcomes:
        if o.summary is None:
            lines.append(f"  {o.candidate.name:26} {o.status}: {o.error}")
            continue
        s = o.summary
        delta = result.verdict.deltas.get(o.candidate.name)
        vs = f"{delta[0] * 100:+.1f} ± {delta[1] * 100:.1f} points" if delta else ""
        lines.append(f"  {o.candidate.name:26} {s.acceptance:6.1%} ({s.low:.1%}-{s.high:.1%}){'':8} "
                     f"{' / '.join(f'{x:.0%}' for x in s.per_position):20} {s.mean_length:6.2f} "
                     f"{(o.tokens_per_s or 0):7.1f}  {vs}")
    lines += ["", f"verdict: {result.verdict.text}"]
    for f in result.findings:
        lines.append(f"  {f.severity.upper():7} {f.code}: {f.message}")
        if f.fix:
            lines.append(f"          fix: {f.fix}")
    if result.not_probed:
        lines.append(f"not probed (no config change to serve): {', '.join(result.not_probed)}")
    lines.append(f"cost: {result.engines} engines, {result.tokens} tokens generated, {result.seconds:.0f} s")
    return "\n".join(lines) + "\n"


def _one_line_error(message: str) -> NoReturn:
    print(f"spectrace: error: probe: {message}", file=sys.stderr)
    sys.exit(2)


def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Register the ``probe`` subcommand on the ``spectrace`` parser."""
    parser = sub.add_parser(
        "probe",
        help="serve the pair under each reading a finding doubts and say which one the drafter was trained for",
        description=(
            "Serve the pair with the real vLLM, offline, on a small prompt sample (greedy, a fixed token budget), as "
            "vLLM resolves it and under each candidate reading: doctor's fixes, a tap sweep, the target's RoPE base "
            "(scratch copies of the drafter's config; the model directories are never written). Exit 0: no reading "
            "beats the served one beyond the interval; 1: one does; 2: bad input."
        ),
    )
    parser.add_argument("--target", metavar="PATH", help="target model directory")
    parser.add_argument("--draft", metavar="PATH", help="drafter model directory")
    parser.add_argument("--method", help="speculative method as given to vLLM (eagle3, dflash, ...)")
    parser.add_argument("--prompts", metavar="FILE", help="JSONL with \"prompt\", or one prompt a line (default: a built-in generic set of 12)")
    parser.add_argument("--k", metavar="K", help="draft tokens per step (default 3)")
    parser.add_argument("--max-tokens", metavar="N", help="tokens generated per prompt (default 32)")
    parser.add_argument("--readings", default="fixes,taps,rope", metavar="LIST",
                        help="candidate families besides the served reading (default: fixes,taps,rope)")
    parser.add_argument("--runner", metavar="v1|v2", help="whose rules doctor applies (default: this host's)")
    parser.add_argument("--dtype", help="as vLLM's --dtype (default: vLLM's)")
    parser.add_argument("--max-model-len", metavar="N", help="as vLLM's --max-model-len (default: the longest prompt + the budget)")
    parser.add_argument("--engine-arg", action="append", metavar="KEY=VALUE",
                        help="another LLM(...) argument for every engine (VALUE as JSON), e.g. gpu_memory_utilization=0.5")
    parser.add_argument("--dir", default=default_dir(), help="the store the runs, probes rows and findings go to")
    parser.add_argument("--no-store", action="store_true", help="untraced engines, nothing stored")
    parser.add_argument("--log", metavar="FILE", help="vLLM's log (default: in the scratch folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (progress on stderr)")
    parser.set_defaults(func=cmd_probe)
    parser.error = _one_line_error  # type: ignore[method-assign]
