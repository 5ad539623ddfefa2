"""``spectrace probe``'s work: doctor's report, the candidates, scratch copies of the drafter, the engines in a child
process, the summaries, the verdict and its records.

The user's model directories are only read: each candidate is a scratch directory holding a rewritten config.json
and links to the drafter's other files. The engines run in ``python -m spectrace.probe.child`` (one engine per
candidate, one after another, multiprocessing off); a child that dies takes only the candidate it was serving, and
another child serves the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from spectrace.audit import codes
from spectrace.probe import candidates as cands
from spectrace.probe import stats
from spectrace.probe.child import MARK

DEFAULT_K = 3
DEFAULT_MAX_TOKENS = 32
MAX_PROMPTS = 1000

# A small generic set: prose, code, lists, a table, counting; short and long.
BUILTIN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "Monday, Tuesday, Wednesday,",
    "Here is a list of the planets in order from the sun: Mercury, Venus,",
    "import json\n\nwith open('config.json') as f:\n    config = json.load(f)\nfor key, value in config.items():\n",
    "| name | age | city |\n|------|-----|------|\n| Alice | 30 | Paris |\n| Bob | 25 |",
    "Speculative decoding runs a small drafter ahead of a large target model. The target verifies the drafted "
    "tokens in one forward pass and keeps the longest prefix it agrees with, so",
    "Q: What is the boiling point of water at sea level?\nA:",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in range(10):\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old woodcutter and his "
    "daughter. Every morning the woodcutter went into the forest with his axe, and every evening he came home",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown",
]


class ProbeInputError(ValueError):
    """Bad input: one line, nothing served."""


@dataclass
class Probe:
    """One pair to probe and how."""

    target: str
    draft: str
    method: str
    prompts: list[str]
    k: int = DEFAULT_K
    max_tokens: int = DEFAULT_MAX_TOKENS
    families: tuple[str, ...] = cands.FAMILIES
    runner: str | None = None  # doctor's rules: None = this host's (v1 on the CPU build, else v2)
    engine: dict[str, Any] = field(default_factory=dict)  # LLM(...) keyword arguments beside the pair
    label: str = ""


@dataclass
class Outcome:
    """One candidate served (or not)."""

    candidate: cands.Candidate
    model: str  # the drafter directory it served
    status: str = "pending"  # ok | failed | crashed | skipped
    error: str | None = None
    run_id: str | None = None
    requests: list[stats.Request] = field(default_factory=list)
    summary: stats.Summary | None = None
    tokens_per_s: float | None = None
    seconds: float = 0.0


@dataclass
class Result:
    probe: Probe
    probe_id: str
    report: dict[str, Any]
    outcomes: list[Outcome]
    verdict: stats.Verdict
    not_probed: list[str]
    findings: list[Any] = field(default_factory=list)
    engines: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def outcome(self, name: str) -> Outcome:
        return next(o for o in self.outcomes if o.candidate.name == name)


# -- input ---------------------------------------------------------------------------------------


def read_prompts(path: str | None) -> list[str]:
    """The user's prompts (JSONL with "prompt", else one prompt a line), or the built-in set."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ProbeInputError(f"cannot read the prompt file {path}: {exc.strerror or exc}") from None
    if b"\x00" in raw[:65536]:
        raise ProbeInputError(f"the prompt file {path} is not text (it holds NUL bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProbeInputError(f"the prompt file {path} is not UTF-8 text (byte {exc.start})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    prompts: list[str] = []
    jsonl = bool(lines) and lines[0].lstrip().startswith("{")
    for number, line in enumerate(lines, 1):
        if not jsonl:
            prompts.append(line)
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ProbeInputError(f"{path}:{number}: not a JSON object (a JSONL prompt file has one per line)") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise ProbeInputError(f"{path}:{number}: no \"prompt\" string")
        prompts.append(row["prompt"])
    if not prompts:
        raise ProbeInputError(f"the prompt file {path} holds no prompt")
    if len(prompts) > MAX_PROMPTS:
        raise ProbeInputError(f"the prompt file {path} holds {len(prompts)} prompts; a probe serves at most {MAX_PROMPTS}")
    return prompts


def check(probe: Probe) -> None:
    for name, value in (("--k", probe.k), ("--max-tokens", probe.max_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ProbeInputError(f"{name} must be a positive integer, not {value!r} (a budget of zero measures nothing)")
    if len(probe.prompts) < 2:
        raise ProbeInputError("a probe needs at least 2 prompts (its interval comes from the per-request spread)")
    unknown = set(probe.families) - set(cands.FAMILIES)
    if unknown:
        raise ProbeInputError(f"unknown readings {sorted(unknown)} (choose from {', '.join(cands.FAMILIES)})")
    for role, path in (("target", probe.target), ("draft", probe.draft)):
        if not (Path(path) / "config.json").is_file():
            raise ProbeInputError(f"--{role} {path}: no config.json there (a probe serves local model directories)")


# -- planning ------------------------------------------------------------------------------------


def _host_runner() -> str:
    from spectrace.doctor import sandbox

    try:
        from vllm.platforms import current_platform

        cpu = current_platform.is_cpu()
    except Exception:
        cpu = False
    runners = sandbox.runners()
    return "v1" if cpu and "v1" in runners else ("v2" if "v2" in runners else runners[0])


def plan(probe: Probe, scratch: Path) -> tuple[dict[str, Any], list[Outcome], list[str]]:
    """Doctor's report, and each candidate with the drafter directory it serves (written under ``scratch``)."""
    from spectrace.doctor import DoctorInputError, diagnose, load_declared

    check(probe)
    try:
        declared = {"target": load_declared(probe.target, "target"), "draft": load_declared(probe.draft, "draft")}
        report = diagnose(probe.target, probe.draft, method=probe.method, num_speculative_tokens=probe.k,
                          runner=probe.runner or _host_runner()).as_dict()
    except DoctorInputError as exc:
        raise ProbeInputError(str(exc)) from None
    found = cands.candidates(report, declared["draft"], declared["target"], probe.families)
    outcomes = []
    for i, candidate in enumerate(found):
        if candidate.kind == "served":
            outcomes.append(Outcome(candidate, probe.draft))
            continue
        out = scratch / f"{i:02d}"
        config = cands.apply(declared["draft"], candidate, report.get("method") or probe.method)
        _scratch_copy(Path(probe.draft), out, config)
        outcome = Outcome(candidate, str(out))
        if candidate.skipped:
            outcome.status, outcome.error = "skipped", candidate.skipped
        outcomes.append(outcome)
    return report, outcomes, cands.not_probed(report, found)


def _scratch_copy(source: Path, out: Path, config: dict[str, Any]) -> None:
    """``out``: the drafter's files as links (never copied, never written) and the candidate's config.json."""
    out.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name == "config.json":
            continue
        os.symlink(entry.resolve(), out / entry.name)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# -- serving -------------------------------------------------------------------------------------


def child_env(store: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one process: one engine after another, no engine-core processes
    env["PYTHONUNBUFFERED"] = "1"
    for key in [k for k in env if k.startswith("SPECTRACE") and k not in ("SPECTRACE_PIPELINE",)]:
        del env[key]
    if store is not None:  # each candidate a traced run in the store: report and diff read it
        env["SPECTRACE"] = "1"
        env["SPECTRACE_DIR"] = str(store)
    return env


CHILD = [sys.executable, "-m", "spectrace.probe.child"]


def serve(jobs: list[dict[str, Any]], *, env: dict[str, str], log: Path, say: Callable[[str], None],
          timeout_s: float = 1800.0, command: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each job in a child process (``command``, default :data:`CHILD`), in order; a child that dies fails the job
    it served and a new one takes the rest."""
    results: dict[str, dict[str, Any]] = {}
    left = list(jobs)
    with open(log, "a") as log_file:
        while left:
            proc = subprocess.Popen(list(command or CHILD), env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
            assert proc.stdin is not None and proc.stdout is not None
            for job in left:
                proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.close()
            current: str | None = None
            tail: list[str] = []
            deadline = time.monotonic() + timeout_s
            for line in proc.stdout:
                if not line.startswith(MARK):
                    log_file.write(line)
                    tail = (tail + [line.rstrip()])[-20:]
                    if time.monotonic() > deadline:
                        proc.kill()
                    continue
                message = json.loads(line[len(MARK):])
                if "started" in message:
                    current = message["started"]
                    n = len(results) + 1
                    label = next((j.get("label") for j in jobs if j["name"] == current), None) or current
                    say(f"[{n}/{len(jobs)}] serving {label} ...")
                    tail = []
                else:
                    result = message["result"]
                    results[result["name"]] = result
                    left = [j for j in left if j["name"] != result["name"]]
                    current = None
            rc = proc.wait()
            if current is not None:  # the process died serving it
                why = next((t for t in reversed(tail) if "Error" in t or "error" in t), tail[-1] if tail else "")
                results[current] = {"name": current, "ok": False, "crashed": True,
                                    "error": f"the engine process died (exit {rc}) serving it: {why}"[:500]}
                left = [j for j in left if j["name"] != current]
            elif left:  # died before starting any job: nothing more would go better
                for job in left:
                    results[job["name"]] = {"name": job["name"], "ok": False, "crashed": True,
                                            "error": f"the engine process exited {rc} before serving it"}
                left = []
    return results


def _engine_kwargs(probe: Probe) -> dict[str, Any]:
    longest = max(len(p) for p in probe.prompts)  # characters: at least as many as tokens for a byte-level BPE
    wanted = longest + probe.max_tokens + probe.k + 16
    try:
        limit = json.loads((Path(probe.target) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        limit = None
    kwargs: dict[str, Any] = {"model": probe.target, "tokenizer": probe.target, "enforce_eager": True, "seed": 0,
                              "max_model_len": min(wanted, limit) if isinstance(limit, int) and limit > 0 else wanted}
    kwargs.update(probe.engine)
    return kwargs


def job_for(probe: Probe, outcome: Outcome, name: str) -> dict[str, Any]:
    return {"name": name, "engine": _engine_kwargs(probe), "prompts": probe.prompts, "max_tokens": probe.max_tokens,
            "speculative": {"method": probe.method, "model": outcome.model, "num_speculative_tokens": probe.k}}


def run(probes: Sequence[Probe], *, store: Path | None = None, scratch: Path | None = None, log: Path | None = None,
        say: Callable[[str], None] = print, env: dict[str, str] | None = None) -> list[Result]:
    """Probe each pair: one child process serves every candidate of every pair, one engine each."""
    started = time.time()
    scratch_dir = Path(scratch) if scratch is not None else Path(tempfile.mkdtemp(prefix="spectrace-probe-"))
    log = Path(log) if log is not None else scratch_dir / "vllm.log"
    plans = []
    for i, probe in enumerate(probes):
        report, outcomes, missing = plan(probe, scratch_dir / f"probe-{i}")
        served = [o for o in outcomes if o.status == "pending"]
        say(f"{probe.label or probe.draft}: {len(served)} readings to serve"
            + "".join(f"\n  {o.candidate.name:24} {o.candidate.note}" + (f" (skipped: {o.error})" if o.error else "")
                      for o in outcomes))
        plans.append((probe, report, outcomes, missing))
    jobs = [{**job_for(p, o, f"{i}:{o.candidate.name}"),
             "label": o.candidate.name if len(plans) == 1 else f"{p.label or p.draft}: {o.candidate.name}"}
            for i, (p, _, outs, _) in enumerate(plans) for o in outs if o.status == "pending"]
    say(f"{len(jobs)} engines, {sum(len(p.prompts) * p.max_tokens for p, _, outs, _ in plans for o in outs if o.status == 'pending')} "
        f"tokens to generate (vLLM's log: {log})")
    raw = serve(jobs, env={**child_env(store), **(env or {})}, log=log, say=say) if jobs else {}
    results = []
    for i, (probe, report, outcomes, missing) in enumerate(plans):
        for o in outcomes:
            if o.status != "pending":
                continue
            r = raw.get(f"{i}:{o.candidate.name}", {"ok": False, "error": "not served"})
            _fill(o, r, probe.k)
            line = (f"  {o.candidate.name}: {o.summary.acceptance:.1%}" if o.summary else
                    f"  {o.candidate.name}: {o.status}: {o.error}")
            say(line)
        results.append(_conclude(probe, report, outcomes, missing))
    if store is not None:
        for result in results:
            write_records(result, store)
    for result in results:
        result.seconds = time.time() - started
    return results


def _fill(o: Outcome, r: dict[str, Any], k: int) -> None:
    o.run_id, o.seconds = r.get("run_id"), float(r.get("seconds") or 0.0)
    if not r.get("ok"):
        o.status, o.error = ("crashed" if r.get("crashed") else "failed"), r.get("error")
        return
    o.requests = [stats.Request.from_vllm(q.get("spec_decode"), q.get("output_tokens", 0)) for q in r["requests"]]
    if not any(q.get("spec_decode") for q in r["requests"]):
        o.status, o.error = "failed", "vLLM reported no per-request speculative metrics"
        return
    o.status = "ok"
    o.summary = stats.summarize(o.requests, k)
    seconds = r.get("generate_seconds") or 0.0
    o.tokens_per_s = sum(q.output_tokens for q in o.requests) / seconds if seconds else None


def _conclude(probe: Probe, report: dict[str, Any], outcomes: list[Outcome], missing: list[str]) -> Result:
    ok = {o.candidate.name: o for o in outcomes if o.status == "ok"}
    v = stats.verdict({n: o.requests for n, o in ok.items()}, {n: o.summary for n, o in ok.items()},
                      {o.candidate.name: o.candidate.reading for o in outcomes})
    result = Result(probe, f"probe-{uuid.uuid4().hex[:12]}", report, outcomes, v, missing,
                    engines=sum(o.status in ("ok", "failed", "crashed") for o in outcomes),
                    tokens=sum(q.output_tokens for o in ok.values() for q in o.requests))
    result.findings = findings(result)
    return result


def findings(result: Result) -> list[Any]:
    """``PROBE_BETTER_READING`` when another reading beats the served one beyond the interval, and the info
    finding that doubted it said again as a warning (``raised_by``)."""
    v = result.verdict
    if not v.beats_served or v.best is None:
        return []
    best, served = result.outcome(v.best), result.outcome(v.served)
    evidence = {
        "reading": best.candidate.name, "kind": best.candidate.kind, "patch": best.candidate.patch,
        "source": best.candidate.source, "acceptance": best.summary.acceptance,
        "acceptance_interval": [best.summary.low, best.summary.high],
        "served_acceptance": served.summary.acceptance,
        "served_interval": [served.summary.low, served.summary.high],
        "delta": v.delta, "delta_half_width": v.half_width, "probe_id": result.probe_id,
        "candidate_run_id": best.run_id, "served_taps": served.candidate.taps, "taps": best.candidate.taps,
        "prompts": len(result.probe.prompts), "max_tokens": result.probe.max_tokens, "k": result.probe.k,
        "settled_by": "measured: the same prompts served under each reading (spectrace probe)",
    }
    out = [codes.finding(codes.PROBE_BETTER_READING, model_role="draft", message=f"the probe measured: {v.text}",
                         evidence=evidence, fix=_fix(best.candidate))]
    doubted = {f["code"]: f for f in result.report.get("findings", [])}.get(best.candidate.source)
    if doubted is not None and doubted.get("severity") == "info" and "warning" in codes.REGISTRY[doubted["code"]].severities:
        out.append(codes.finding(doubted["code"], "warning", model_role=doubted.get("model_role"),
                                 message=doubted["message"] + f" (confirmed by the probe: {v.text})",
                                 evidence={**(doubted.get("evidence") or {}), "raised_by": codes.PROBE_BETTER_READING,
                                           "probe_id": result.probe_id},
                                 fix=doubted.get("fix"), caused_by=None))
    return out


def _fix(candidate: cands.Candidate) -> str:
    if candidate.kind == "taps":
        return f"declare the taps the drafter was trained on: {candidate.taps} (vLLM ids; eagle_aux_hidden_state_layer_ids)"
    changes = ", ".join(f"{k.removeprefix('layer.')} = {json.dumps(v)}" for k, v in candidate.patch.items())
    return f"set in the drafter's config.json: {changes}"


# -- records -------------------------------------------------------------------------------------


def rows(result: Result) -> tuple[str, list[dict[str, Any]]]:
    """The ``probes`` rows (one a candidate) and the run id they go under (the served run's, else the probe's)."""
    served = result.outcome("served")
    run_id = served.run_id or result.probe_id
    ts = time.time_ns()
    out = []
    for o in result.outcomes:
        s = o.summary
        delta = result.verdict.deltas.get(o.candidate.name)
        out.append({
            "run_id": run_id, "process_role": "probe", "pid": os.getpid(), "host": _host(), "ts": ts, "probe_id": result.probe_id,
            "candidate": o.candidate.name, "kind": o.candidate.kind, "source": o.candidate.source,
            "reading": o.candidate.reading, "patch": json.dumps(o.candidate.patch), "taps": json.dumps(o.candidate.taps),
            "status": o.status, "error": o.error, "candidate_run_id": o.run_id,
            "target_model": result.probe.target, "draft_model": result.probe.draft, "method": result.probe.method,
            "num_speculative_tokens": result.probe.k, "prompts": len(result.probe.prompts),
            "max_tokens": result.probe.max_tokens,
            "drafted": s.drafted if s else None, "accepted": s.accepted if s else None,
            "acceptance": s.acceptance if s else None, "acceptance_low": s.low if s else None,
            "acceptance_high": s.high if s else None, "per_position": json.dumps(s.per_position) if s else None,
            "mean_acceptance_length": s.mean_length if s else None, "tokens_per_s": o.tokens_per_s,
            "delta": delta[0] if delta else None, "delta_half_width": delta[1] if delta else None,
            "best": o.candidate.name == result.verdict.best, "verdict": result.verdict.text,
        })
    return run_id, out


def _host() -> str:
    import socket

    return socket.gethostname()


def write_records(result: Result, store: Path) -> None:
    from spectrace.settings import Settings
    from spectrace.sinks import build

    run_id, probe_rows = rows(result)
    pipeline, _ = build(Settings(dir=Path(store), exporters=("duckdb",)))
    pipeline.extend("probes", probe_rows)
    for f in result.findings:
        pipeline.append("findings", {"run_id": run_id, "process_role": "probe", "pid": os.getpid(), "host": _host(), "ts": time.time_ns(), "code": f.code,
                                     "severity": f.severity, "component": f.component, "model_role": f.model_role,
                                     "message": f.message, "evidence": json.dumps(f.evidence, default=str),
                                     "fix": f.fix, "caused_by": f.caused_by})
    pipeline.flush()
    pipeline.close()
