"""`spectrace report`: a readable summary of one run, from the store's views."""

from __future__ import annotations

import json

from typing import Any

from spectrace import audit
from spectrace.audit import codes
from spectrace.audit.rules.acceptance import band_order
from spectrace.audit.rules.speedup_figure import SPEEDUP_DEFINITION, SPEEDUP_UNMEASURED
from spectrace.audit.curve import K_BETTER_MARGIN, best_k
from spectrace.audit.store_judge import TIE, StoreVerdicts, judge_store
from spectrace.console import format_table, number, ratio


class ReportError(Exception):
    pass


_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def _one(con, sql: str, params: list[Any]) -> tuple | None:
    return con.execute(sql, params).fetchone()


def render(con, *, run_id: str | None = None, plot: str | None = None) -> str:
    if run_id is None:
        row = _one(con, "select run_id from runs order by started_at desc nulls last limit 1", [])
        if row is None:
            raise ReportError("no run in this store yet")
        run_id = row[0]
    run = con.execute(
        "select run_id, started_at, host, vllm_version, spectrace_version, target_model, draft_model, method, "
        "method_inferred, num_speculative_tokens, model_runner, trace_id from runs where run_id = ?",
        [run_id],
    ).fetchone()
    if run is None:
        known = [r[0] for r in con.execute("select run_id from runs order by started_at desc limit 5").fetchall()]
        raise ReportError(f"no run {run_id!r} in this store (latest: {', '.join(known) or 'none'})")
    out: list[str] = []
    (rid, started, host, vllm_v, st_v, target, draft, method, inferred, k, runner, trace_id) = run
    out.append(f"spectrace report — run {rid}")
    out.append(f"  started   {started}  on {host}")
    out.append(f"  versions  vLLM {vllm_v}, spectrace {st_v}, model runner {runner or '?'}")
    out.append(f"  target    {target}")
    if method:
        out.append(f"  draft     {draft or '(none: ' + method + ')'}")
        out.append(f"  method    {method}{' (inferred from the path)' if inferred else ''}, k = {k}")
    else:
        out.append("  no speculative decoding configured")
    out.append(f"  trace     {trace_id}")
    missing = con.execute(
        "select distinct hook, status, detail from hooks where run_id = ? and status in ('missing', 'unsupported') "
        "order by hook", [rid]
    ).fetchall()
    if missing:
        out.append("")
        out.append("Hooks not installed (that part of the audit is unavailable):")
        out += [f"  {hook} ({status}): {detail}" for hook, status, detail in missing]
    if method and _never_stepped(con, rid):
        out.append("")
        out.append("The engine never reached a step: no worker step, no verification and no attention layout were recorded "
                   "for this run. vLLM most likely failed while starting (out of memory, a bad flag, a model it cannot "
                   "load): its log has the error, after spectrace's start-up line for this run (\"spectrace: tracing on "
                   f"in pid N ...; run {rid}\").")
    out.append("")
    verdicts = judge_store(con, rid)  # every verdict here is the audit's: this module renders
    out += _findings(verdicts, run_speedup(con, rid))
    for role in ("target", "draft"):
        out.append("")
        out += _layout(con, rid, role)
    taps = _taps(con, rid)
    if taps:
        out.append("")
        out += taps
    models = _models(con, rid)
    if models:
        out.append("")
        out += models
    ranks = _ranks(verdicts)
    if ranks:
        out.append("")
        out += ranks
    out.append("")
    out += _acceptance(con, rid, plot, verdicts)
    requests = _requests(con, rid)
    if requests:
        out.append("")
        out += requests
    thinking = _thinking(con, rid)
    if thinking:
        out.append("")
        out += thinking
    shapes = _step_shapes(con, rid)
    if shapes:
        out.append("")
        out += shapes
    return "\n".join(out) + "\n"


STEP_TABLES = ("speculation_steps", "decode_steps", "chunk_steps", "host_steps", "verify_counts", "attention_layout")


def _never_stepped(con, run_id: str) -> bool:
    """No table a running engine writes holds a row of ``run_id`` (a table not in the store holds none)."""
    import duckdb

    for table in STEP_TABLES:
        try:
            if con.execute(f"select 1 from {table} where run_id = ? limit 1", [run_id]).fetchone():
                return False
        except duckdb.Error:  # not in this store (or lake) yet
            continue
    return True


def _requests(con, run_id: str) -> list[str]:
    """Acceptance by request slice (dimensions where the run's requests differ), prefix-cache hits, drafts unverified."""
    lines: list[str] = []
    rows = con.execute(
        "select dimension, value, requests, drafted, accepted, rate from acceptance_by_slice where run_id = ? "
        "and dimension in (select dimension from acceptance_by_slice where run_id = ? group by dimension "
        "having count(*) > 1) order by dimension, value",
        [run_id, run_id],
    ).fetchall()
    if rows:
        lines.append("Acceptance by request slice (where the run's requests differ)")
        table = [(d, v, n, drafted, accepted, number(rate, ".1%")) for d, v, n, drafted, accepted, rate in rows]
        lines.append(_indent(format_table(["dimension", "value", "requests", "drafted", "accepted", "rate"], table)))
    hits = con.execute("select requests, requests_hit, prompt_tokens, cached_tokens from prefix_cache_hits where run_id = ?",
                       [run_id]).fetchone()
    if hits and hits[1]:
        requests, hit, prompt, cached = hits
        lines.append(f"  prefix cache: {hit} of {requests} requests hit, {cached} of {prompt} prompt tokens restored")
    budget = con.execute("select sum(proposed), sum(verified) from draft_budget where run_id = ?", [run_id]).fetchone()
    if budget and budget[0]:
        proposed, verified = budget
        lines.append(f"  drafts: {proposed} proposed, {verified} verified ({ratio(proposed - verified, proposed)} not, "
                     "each finished request's last proposal included)")
    lines += _worst_requests(con, run_id, {dimension for dimension, *_ in rows})
    if lines and not rows:
        lines.insert(0, "Requests")
    return lines


WORST_REQUESTS = 5  # the requests the report lists, lowest draft acceptance first
MIN_STEPS = 3  # ... among those with at least this many verify steps


def _worst_requests(con, run_id: str, differ: set[str]) -> list[str]:
    """Per request in vLLM's schema (the view ``request_spec_decode``): what the run's requests emitted per step
    against their acceptance length, and the requests that accepted least, with their slice (its dimensions in
    ``differ``: those where the run's requests differ, the slice table's)."""
    whole = con.execute(
        "select count(*), sum(num_spec_steps), sum(num_accepted_draft_tokens), sum(emitted_tokens) "
        "from request_spec_decode where run_id = ?", [run_id]).fetchone()
    if not whole or not whole[0] or not whole[1]:
        return []
    requests, steps, accepted, emitted = whole
    lines = [f"  per request ({requests} requests, vLLM's per-request schema: view request_spec_decode): acceptance length "
             f"{number(1 + accepted / steps, '.2f')}, tokens emitted per verify step "
             f"{number(emitted / steps, '.2f') if emitted is not None else '-'}"
             + (" (requests that stopped inside an accepted draft emitted less than they accepted)"
                if emitted is not None and emitted < accepted + steps else "")]
    worst = con.execute(
        "select coalesce(external_request_id, request_id), choice_index, num_spec_steps, draft_acceptance_rate, "
        "mean_acceptance_length, "
        "emitted_per_step, \"slice\" from request_spec_decode where run_id = ? and num_spec_steps >= ? "
        "order by draft_acceptance_rate, request_id limit ?", [run_id, MIN_STEPS, WORST_REQUESTS]).fetchall()
    if len(worst) > 1:
        lines.append(f"  lowest acceptance (requests with {MIN_STEPS}+ verify steps):")
        table = [(rid, "-" if choice is None else choice, n, number(rate, ".1%"), number(length, ".2f"),
                  number(per_step, ".2f"), _slice_text(s, differ))
                 for rid, choice, n, rate, length, per_step, s in worst]
        lines.append(_indent(_indent(format_table(
            ["request (response id)", "choice", "steps", "rate", "acceptance length", "emitted/step", "slice"], table))))
    return lines


def _slice_text(value, dimensions: set[str]) -> str:
    """A request's slice (JSON, dimension -> banded value) as ``k=v`` pairs of ``dimensions``; '-' where none."""
    try:
        labels = json.loads(value) if value else {}
    except (TypeError, ValueError):
        return "-"
    if not isinstance(labels, dict):
        return "-"
    return ", ".join(f"{k}={v}" for k, v in labels.items() if k in dimensions) or "-"


def _findings(verdicts: StoreVerdicts, whole: tuple | None = None) -> list[str]:
    # the store's own verdicts (rank disagreements have their own section) marked as such; SPECULATION_NOT_PAYING
    # (said while serving, over the steps it had seen) beside the same figure over the whole run
    # a finding a later one cleared (rules.active: a recovery ends its collapse) is said so, as /metrics and top
    # no longer show it
    def said(f, status=None) -> str:
        if f.code == codes.SPECULATION_NOT_PAYING and whole is not None:
            return f"{f.message}; over the whole run: {whole[0]:.2f}x ({whole[1]} steps)"
        if status is not None and status.cleared_by:
            return f"{f.message} (cleared since: {status.cleared_by})"
        return f.message

    statuses = verdicts.status or [None] * len(verdicts.recorded)
    rows = [(f.code, f.severity, f.model_role, said(f, s), f.fix, f.caused_by, None)
            for f, s in zip(verdicts.recorded, statuses)]
    rows += [(f.code, f.severity, f.model_role, f.message + " (from the store)", f.fix, f.caused_by, None)
             for f in verdicts.derived if f.component != "ranks"]
    if not rows:
        return ["Findings: none"]
    errors = sum(1 for r in rows if r[1] == "error")
    warnings = sum(1 for r in rows if r[1] == "warning")
    lines = [f"Findings: {errors} error(s), {warnings} warning(s), {len(rows) - errors - warnings} info"]
    cleared = sum(1 for s in statuses if s is not None and s.cleared_by)
    if cleared:
        lines[0] += f"; {cleared} cleared since, not active"
    roots = sorted([r for r in rows if not r[5]], key=lambda r: _SEVERITY_ORDER.get(r[1], 3))
    for code, severity, role, message, fix, _, _ in roots:
        lines.append(f"  {severity.upper():7} {code} [{role or '-'}] {message}")
        if fix:
            lines.append(f"          fix: {fix}")
        for c in [r for r in rows if r[5] == code]:
            lines.append(f"          ↳ {c[0]} ({c[1]}): {c[3]}")
    orphans = [r for r in rows if r[5] and r[5] not in {root[0] for root in roots}]
    for code, severity, role, message, _, cause, _ in orphans:
        lines.append(f"  {severity.upper():7} {code} [{role or '-'}] {message} (caused by {cause})")
    return lines


def _layout(con, run_id: str, role: str) -> list[str]:
    rows = con.execute(
        "select layer_index, layer_name, declared_type, declared_window, resolved_type, resolved_window, "
        "runtime_type, runtime_window, kv_cache_spec, causal, rank from attention_layout "
        "where run_id = ? and model_role = ? and rank is not distinct from (select min(rank) from attention_layout "
        "where run_id = ? and model_role = ?) order by layer_index",  # one rank; the ranks are compared below
        [run_id, role, run_id, role],
    ).fetchall()
    if not rows:
        return [f"Attention layout ({role}): not recorded"]
    plans = [
        audit.LayerPlan(
            layer_index=idx, declared_type=dt or audit.UNSPECIFIED, declared_window=dw, resolved_type=rt_,
            resolved_window=rw, runtime_type=run_t, runtime_window=run_w,
        )
        for idx, _, dt, dw, rt_, rw, run_t, run_w, *_ in rows
    ]
    # the audit's own rule (LAYOUT_MISMATCH)
    vs_resolved, vs_declared = audit.mismatched_layers(plans)
    flagged = {plan.layer_index for plan in vs_resolved + vs_declared}
    table = []
    for idx, name, dt, dw, rt_, rw, run_t, run_w, spec, causal, rank in rows:
        table.append(
            (
                "!" if idx in flagged else "",
                idx,
                _type(dt, dw),
                _type(rt_, rw),
                _type(run_t, run_w),
                spec or "",
                "" if causal is None else ("yes" if causal else "no"),
                name,
            )
        )
    mismatches = len(flagged)
    header = f"Attention layout ({role}): {len(rows)} layers" + (f", {mismatches} mismatched (!)" if mismatches else "")
    return [header, _indent(format_table(["", "layer", "declared", "resolved", "runtime", "kv spec", "causal", "vLLM layer"], table))]


def _ranks(verdicts: StoreVerdicts) -> list[str]:
    """Tensor-parallel ranks compared (RANK_DISAGREEMENT); nothing for a one-rank engine."""
    ranks, findings, hosts = verdicts.ranks, verdicts.rank_findings(), verdicts.hosts
    if len(ranks) < 2:
        return []
    several = len(set(hosts.values())) > 1  # one engine over several hosts (multi-node TP/PP, Ray)
    seen = ", ".join(f"{r} on {hosts.get(r)}" if several else str(r) for r in ranks)
    if not findings:
        return [f"Ranks: {len(ranks)} ({seen}) agree on layout, taps and verified counts"]
    lines = [f"Ranks: {len(ranks)} ({seen}), {len(findings)} disagreement(s)"]
    lines += [f"  ERROR   {f.code} {f.message}" for f in findings]
    return lines


def _taps(con, run_id: str) -> list[str]:
    rows = con.execute(
        "select rank, declared_field, declared_ids, expected_ids, tapped_ids, input_taps, status, capture_point "
        "from hidden_state_taps where run_id = ? order by rank nulls first",
        [run_id],
    ).fetchall()
    if not rows:
        return []
    table = [
        ("" if rank is None else rank, field or "(none declared)", declared, expected, tapped, inputs, status)
        for rank, field, declared, expected, tapped, inputs, status, _ in rows
    ]
    points = sorted({point for *_, point in rows if point})
    return [
        "Hidden-state taps (vLLM ids: k = output of target layer k-1)",
        _indent(format_table(["rank", "declared in", "declared", "expected", "tapped", "fc takes", "status"], table)),
        *(["  each tap captures: " + "; ".join(points)] if points else []),
    ]


def _models(con, run_id: str) -> list[str]:
    """Per model and rank: the checkpoint, what vLLM loaded, shared modules, dtype and RoPE run with."""
    rows = con.execute(
        "select model_role, rank, checkpoint_tensors, checkpoint_dtypes, manifest_error, parameters, loaded, unloaded, "
        "embed_tokens, lm_head, declared_dtype, runtime_dtype, runtime_rope from model_weights where run_id = ? "
        "order by model_role desc, rank nulls first",
        [run_id],
    ).fetchall()
    if not rows:
        return []
    table = []
    for role, rank, tensors, dtypes, error, params, loaded, unloaded, embed, head, declared, runtime, rope in rows:
        names = json.loads(unloaded) if unloaded else None
        rope = json.loads(rope) if rope else None
        table.append((
            "!" if names else "",
            role,
            "" if rank is None else rank,
            error or f"{tensors} ({', '.join(f'{k} {v}' for k, v in json.loads(dtypes or '{}').items())})",
            "?" if loaded is None else f"{loaded}/{params}",
            len(names) if names is not None else "?",
            "/".join(x or "-" for x in (embed, head)) if role == "draft" else "",
            f"{declared or '?'} -> {runtime or '?'}",
            f"{rope.get('rope_type')} {rope.get('base')}" + (" neox" if rope.get("neox_style") else "") if rope else "?",
        ))
    return [
        "Models (checkpoint from safetensors headers; loaded: parameters vLLM's loader filled)",
        _indent(format_table(["", "model", "rank", "checkpoint tensors", "loaded", "unloaded", "embed/head", "dtype", "rope"], table)),
    ]


def _type(kind: str | None, window: int | None) -> str:
    if kind is None:
        return "?"
    return f"{kind}({window})" if window else kind


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _acceptance(con, run_id: str, plot: str | None, verdicts: StoreVerdicts) -> list[str]:
    rows = con.execute(
        "select position, drafted, accepted, rate from acceptance_by_position where run_id = ? order by position",
        [run_id],
    ).fetchall()
    if not rows:
        return ["Acceptance: no verification step recorded"]
    lines = ["Acceptance by position (accepted / drafted at that position)"]
    lines.append(_indent(format_table(["position", "drafted", "accepted", "rate"], [(p, d, a, number(r, ".1%")) for p, d, a, r in rows])))
    lengths = con.execute(
        "select sum(length * count) / sum(count), sum(count) from acceptance_lengths where run_id = ? and source = 'engine_core'",
        [run_id],
    ).fetchone()
    if lengths and lengths[1]:
        lines.append(f"  mean acceptance length {number(lengths[0], '.2f')} tokens per step over {int(lengths[1])} request-steps")
    boundaries = con.execute(
        "select distinct tokens, model_role, field from context_boundaries where run_id = ? order by tokens", [run_id]
    ).fetchall()
    heatmap, ranges = context_heatmap(con, run_id)
    if ranges:
        starts = {tokens: f"{role} {field}" for tokens, role, field in boundaries}
        positions = sorted({p for _, p in heatmap})
        lines.append("By context length (ranges split at the run's boundaries, marked |)")
        table = []
        for label, low in ranges:
            d = sum(heatmap.get((label, p), (0, 0))[0] for p in positions)
            a = sum(heatmap.get((label, p), (0, 0))[1] for p in positions)
            cells = [_rate(*heatmap[(label, p)]) if (label, p) in heatmap else "" for p in positions]
            table.append(("|" if low in starts else "", label, d, a, _rate(d, a), *cells, starts.get(low, "")))
        headers = ["", "context", "drafted", "accepted", "rate", *[f"pos {p}" for p in positions], "boundary"]
        lines.append(_indent(format_table(headers, table)))
    lines += _shapes(con, run_id)
    lines += _cost(con, run_id, verdicts)
    lines += _by_k(verdicts)
    agreement = con.execute(
        "select source, rank, sum(drafted), sum(accepted) from verify_counts where run_id = ? group by all order by source, rank",
        [run_id],
    ).fetchall()
    if len(agreement) > 1:
        lines.append("Engine core vs workers (drafted / accepted): " + ", ".join(
            f"{s}{'' if r is None else ' rank ' + str(r)} {d}/{a}" for s, r, d, a in agreement
        ))
    episodes = con.execute(
        "select ts, code, evidence from findings where run_id = ? and code in (?, ?) order by ts",
        [run_id, codes.ACCEPTANCE_COLLAPSE, codes.ACCEPTANCE_RECOVERED],
    ).fetchall()
    lines.append("Collapse timeline: none" if not episodes else "Collapse timeline:")
    lines += _timeline(episodes)
    lines += _in_time(con, run_id)
    if plot:
        from spectrace.queries import plot as plotting

        try:
            plotting.acceptance_png(plot, rows, heatmap, ranges, boundaries, title=f"run {run_id}")
        except (plotting.PlotError, OSError) as exc:
            raise ReportError(f"cannot write the plot: {exc}") from None
        lines.append(f"Plot written to {plot}")
    return lines


def _rate(drafted: int, accepted: int) -> str:
    return ratio(accepted, drafted)


def context_heatmap(con, run_id: str) -> tuple[dict[tuple[str, int], tuple[int, int]], list[tuple[str, int]]]:
    """(context range, position) -> (drafted, accepted), and the ranges (label, low) in order.

    Runs recorded before per-run ranges existed fall back to the fixed buckets.
    """
    rows = con.execute(
        "select coalesce(context_range, context_bucket), position, sum(drafted), sum(accepted) from verify_counts "
        "where run_id = ? and source = 'engine_core' group by all",
        [run_id],
    ).fetchall()
    heatmap = {(label, int(p)): (int(d), int(a)) for label, p, d, a in rows if label is not None}
    ranges = sorted({(label, _low(label)) for label, _ in heatmap}, key=lambda r: r[1])
    return heatmap, ranges


def _low(label: str) -> int:
    text = label.split("-")[0].rstrip("+")
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def _shapes(con, run_id: str) -> list[str]:
    row = con.execute(
        "select sum(rows), sum(repeated_rows), sum(repeated_accepted), sum(repeated_drafted) from draft_shapes where run_id = ?",
        [run_id],
    ).fetchone()
    if not row or not row[0]:
        return []
    rows, repeated, accepted, drafted = row
    return [f"  one-token draft rows: {repeated} of {rows} ({ratio(repeated, rows)})"
            + (f", {accepted} of their {drafted} tokens accepted" if repeated else "")]


def run_speedup(con, run_id: str) -> tuple[float, int, Any] | None:
    """The run's speed-up (``spectrace.audit.rules.speedup_figure.SPEEDUP_DEFINITION``) over the run's steps that verified drafts
    (:data:`~spectrace.audit.rules.speedup_figure.SPEEDUP_WINDOW`), from the lowest worker rank's sums (``speculation_cost``: the sums
    SPECULATION_NOT_PAYING, ``top`` and the gauge read): ``(speed-up, steps, rank)``, or None before any."""
    row = con.execute("select speedup_estimate, steps, rank from speculation_cost where run_id = ? and speedup_estimate "
                      "is not null order by rank nulls first limit 1", [run_id]).fetchone()
    return (float(row[0]), int(row[1]), row[2]) if row else None


def speedup_text(value: float, steps: int) -> str:
    """The speed-up as every surface prints it: the figure, its window and its basis."""
    return f"{value:.2f}x over the run's {steps} steps that verified drafts ({SPEEDUP_UNMEASURED})"


def _cost(con, run_id: str, verdicts: StoreVerdicts) -> list[str]:
    rows = con.execute(
        "select rank, steps, step_ms, draft_ms, verify_ms, no_draft_ms, mean_acceptance_length, speedup_estimate "
        "from speculation_cost where run_id = ? order by rank nulls first",
        [run_id],
    ).fetchall()
    if not rows:
        return []
    lines = ["Does speculation pay? (worker host clock, every step of the run that verified drafts, per rank)",
             f"  speed-up: {SPEEDUP_DEFINITION}"]
    table = [
        ("" if rank is None else rank, steps, number(step, ".2f"), number(draft, ".2f"), number(verify, ".2f"),
         number(no_draft, ".2f"), number(length, ".2f"), "-" if est is None else number(est, ".2f") + "x")
        for rank, steps, step, draft, verify, no_draft, length, est in rows
    ]  # fmt: skip
    headers = ["rank", "steps", "step ms", "draft ms", "verify ms", "no-draft ms (fit)", "mean length", "speed-up (fit)"]
    lines.append(_indent(format_table(headers, table)))
    whole = run_speedup(con, run_id)
    if whole is not None:
        lines.append(f"  speed-up {speedup_text(*whole[:2])}"
                     + ("" if whole[0] >= 1 else ": speculation costs more than it saves here"))
    in_force = next((r for r in verdicts.by_k if r.get("in_force")), None)
    if in_force is not None and in_force["step_source"] == "baseline" and in_force["speedup"] is not None:
        lines.append(f"  measured: {number(in_force['speedup'], '.2f')}x at k = {in_force['k']} in force, priced from steps "
                     "without drafts measured on this target (What k pays, below: host time and what stops cut included)")
    else:
        lines.append("  not measured: trace one run of this target without speculation (same host) to price a step "
                     "without drafts; until then every speed-up here is the fit's estimate")
    return lines


def _relative(rows: list[dict]) -> dict[int, float | None]:
    """Each k' row's speed-up over the in-force row's (the fit's figures, compared, never printed as speed-ups)."""
    base = next((r["speedup"] for r in rows if r.get("in_force")), None)
    return {r["k"]: (r["speedup"] / base if base and r["speedup"] is not None else None) for r in rows}


def _by_k(verdicts: StoreVerdicts) -> list[str]:
    """What k pays (``spectrace.audit.rules.speedup.from_store``) and, where the run served more than one band, by batch size.
    Priced from measured steps without drafts: speed-ups; fitted from the run alone: each k' against the k in force
    (a figure not priced against a measured baseline is not printed as a speed-up)."""
    rows, bands, pick, close = verdicts.by_k, verdicts.by_k_bands, verdicts.best, verdicts.ties
    if not rows:
        return []
    measured = rows[0]["step_source"] == "baseline"
    priced = ("step times measured without drafts on this target (decode_steps)" if measured
              else "step times fitted from this run alone, not measured: each k' against the k in force, not a speed-up")
    lines = [f"What k pays (this run's per-position counts; {priced}; model and limits: docs, What k pays)"]
    if rows[0].get("chunk_share"):
        lines.append(f"  prefill chunks: {number(rows[0]['chunk_share'], '.0%')} of the run's worker time, held fixed at every k")
    relative = _relative(rows)

    def shown(r) -> str:
        if measured:
            return "-" if r["speedup"] is None else number(r["speedup"], ".2f") + "x"
        return number(relative.get(r["k"]), ".2f")

    table = [(f"{r['k']}{' (in force)' if r['in_force'] else ''}{' (extrapolated)' if r['extrapolated'] else ''}",
              number(r["expected_length"], ".2f"), number(r.get("emitted_length") or r["expected_length"], ".2f"),
              number(r["step_ms"], ".2f"), number(r.get("host_ms") or 0.0, ".2f"), shown(r))
             for r in rows]  # fmt: skip
    last = "speed-up (measured)" if measured else "vs k in force (fit)"
    lines.append(_indent(format_table(["k", "expected length", "emitted", "worker step ms", "host ms", last], table)))
    if pick is not None:
        name = "no speculation" if pick["k"] == 0 else f"k = {pick['k']}"
        if measured:
            said = name + f" ({number(pick['speedup'], '.2f')}x)"
            lines.append("  best: " + said + (f"; k' = {', '.join(map(str, close))} within {TIE * 100:.0f} % of it: a tie, "
                                              "not advice" if close else ""))
            if verdicts.pays_unresolved:
                lines.append(f"  no speculation is within the model's error of it ({K_BETTER_MARGIN * 100:.0f} %): "
                             "speculating is not shown to pay here")
        else:  # the fit prices step(0) high where a step's cost is not affine in its tokens (docs: "What k pays")
            lines.append(f"  highest by the fit: {name} ({number(relative.get(pick['k']), '.2f')} of the k in force); not "
                         "advice: trace one run of this target without speculation to price a step without drafts")
    if len(bands) > 1:
        ks = sorted({r["k"] for band_rows in bands.values() for r in band_rows})
        lines.append("  by batch size (each band's own acceptance and measured step times; a fitted band: each k' against "
                     "its k in force)")
        table = []
        for band, band_rows in bands.items():
            band_measured = band_rows[0]["step_source"] == "baseline"
            speedups = ({r["k"]: r["speedup"] for r in band_rows} if band_measured else _relative(band_rows))
            top = best_k(band_rows)
            table.append((band, "measured" if band_measured else "fit",
                          *["-" if speedups.get(k) is None else number(speedups[k], ".2f") + ("x" if band_measured else "")
                            for k in ks],
                          "-" if top is None else ("none" if top["k"] == 0 else top["k"])))
        lines.append(_indent(_indent(format_table(["batch", "priced", *[f"k={k}" for k in ks], "best"], table))))
    return lines


def _step_shapes(con, run_id: str) -> list[str]:
    """The k each batch size drafted, when it was not one k (dynamic speculation, a trimming token budget), and
    how often k switched from one verified step to the next."""
    rows = con.execute(
        "select batch_band, k, sum(steps), sum(request_steps), sum(drafted), sum(accepted), sum(k_switches) "
        "from step_shapes where run_id = ? group by all", [run_id]).fetchall()
    if len({k for _, k, *_ in rows}) < 2:
        return []
    rows.sort(key=lambda r: (band_order(r[0]), r[1]))
    table = [(band, k, steps, "-" if switched is None else switched, request_steps, _rate(drafted, accepted))
             for band, k, steps, request_steps, drafted, accepted, switched in rows]
    lines = ["The k each batch size drafted (steps by batch-size band and the most drafts one request got; switched: "
             "steps right after a step that drafted another k)",
             _indent(format_table(["batch", "k", "steps", "switched", "request-steps", "acceptance"], table))]
    if all(r[6] is not None for r in rows):  # stores written before switches were counted hold NULL
        steps, switched = sum(r[2] for r in rows), sum(r[6] for r in rows)
        lines.append(f"  k switched in {switched} of {steps} verified steps ({ratio(switched, steps)})")
    return lines


TIME_SIGNATURES = (codes.ACCEPTANCE_STEP_CHANGE, codes.ACCEPTANCE_DECAY, codes.ACCEPTANCE_RESTORED)


def _in_time(con, run_id: str) -> list[str]:
    """The run's acceptance in time (spectrace.audit.rules.drift): each step change or decay with its start, the
    requests it spanned, and its recovery; "steady" when none was found."""
    import json

    rows = con.execute(
        f"select code, evidence from findings where run_id = ? and code in ({', '.join('?' * len(TIME_SIGNATURES))}) "
        "order by ts", [run_id, *TIME_SIGNATURES]).fetchall()
    if not rows:
        return ["Acceptance in time: steady (no step change, no decay, against the run's own level)"]
    lines = ["Acceptance in time:"]
    for code, evidence in rows:
        ev = json.loads(evidence) if isinstance(evidence, str) else (evidence or {})
        if code == codes.ACCEPTANCE_RESTORED:
            lines.append(f"  {ev.get('recovered', '?')} restored: {number(ev.get('rate_now'), '.1%')} "
                         f"(before the {'step' if ev.get('signature') == 'step' else 'decay'}: "
                         f"{number(ev.get('rate_before'), '.1%')})")
            continue
        kind = "stepped down" if code == codes.ACCEPTANCE_STEP_CHANGE else "began to decay"
        carried = ev.get("carried_requests") or 0
        within = (f"; {carried} requests across it: {number(ev.get('carried_rate_before'), '.1%')} -> "
                  f"{number(ev.get('carried_rate_after'), '.1%')}" if carried else "; no request across it")
        lines.append(f"  {ev.get('onset', '?')} {kind}: {number(ev.get('rate_before'), '.1%')} -> "
                     f"{number(ev.get('rate_after'), '.1%')}{within}")
    if rows[-1][0] != codes.ACCEPTANCE_RESTORED:
        lines.append("  (not restored)")
    return lines


def _thinking(con, run_id: str) -> list[str]:
    """Acceptance by thinking mode (with where each mode was read) and by the phase each verify step was drafted
    in (view ``acceptance_by_thinking``); nothing where no request's mode is known and no phase was read."""
    rows = con.execute("select kind, value, sources, requests, request_steps, drafted, accepted, rate "
                       "from acceptance_by_thinking where run_id = ? order by kind, value", [run_id]).fetchall()
    if not any(kind == "phase" or value != "unknown" for kind, value, *_ in rows):
        return []
    table = [(kind, value, sources or "", requests if kind == "mode" else steps, drafted, accepted,
              number(rate, ".1%")) for kind, value, sources, requests, steps, drafted, accepted, rate in rows]
    return ["Acceptance by thinking mode (requests) and phase (verify steps: drafted in reasoning or in the answer)",
            _indent(format_table(["by", "value", "read from", "requests / steps", "drafted", "accepted", "rate"],
                                 table))]


def _timeline(episodes: list[tuple]) -> list[str]:
    import json

    lines = []
    for ts, code, evidence in episodes:
        ev = json.loads(evidence) if isinstance(evidence, str) else (evidence or {})
        if code == codes.ACCEPTANCE_COLLAPSE:
            began = f"began at step {ev['onset_step']}, context {ev['onset_context_len']}" if "onset_step" in ev else "onset unknown"
            lines.append(f"  {ts} collapsed ({began}): position 0 {number(ev.get('position_0_rate'), '.1%')}, "
                         f"overall {number(ev.get('overall_rate'), '.1%')}")  # fmt: skip
        else:
            at = f" at step {ev['recovered_step']}, context {ev['recovered_context_len']}" if "recovered_step" in ev else ""
            lines.append(f"  {ts} recovered{at}: position 0 {number(ev.get('position_0_rate'), '.1%')}, "
                         f"overall {number(ev.get('overall_rate'), '.1%')}")
    if episodes and episodes[-1][1] == codes.ACCEPTANCE_COLLAPSE:
        lines.append("  (not recovered)")
    return lines
