"""Doctor's report as text: the layout per layer, the tap audit, the findings by root cause."""

from __future__ import annotations

from typing import Any

from spectrace.console import format_table, listed, terminal
from spectrace.doctor.diagnose import Report


def _cell(kind: str | None, window: int | None) -> str:
    if kind is None:
        return "-"
    if window:
        return f"{kind}({window})"
    return kind


def _layout_table(rows: list[dict[str, Any]]) -> str:
    columns = ["layer", "declared", "resolved", "runtime", "causal", "kv_cache_spec"]
    # runs of identical layers read as one row ("0-35")
    collapsed: list[list[Any]] = []
    previous = None
    for row in rows:
        values = (
            _cell(row["declared_type"], row["declared_window"]),
            _cell(row["resolved_type"], row["resolved_window"]),
            _cell(row["runtime_type"], row["runtime_window"]),
            "-" if row.get("causal") is None else str(row["causal"]).lower(),
            row.get("kv_cache_spec") or "-",
        )
        if collapsed and values == previous:
            first = str(collapsed[-1][0]).split("-")[0]
            collapsed[-1][0] = f"{first}-{row['layer_index']}"
        else:
            collapsed.append([str(row["layer_index"]), *values])
        previous = values
    return format_table(columns, collapsed, max_width=40)


def _scheduler_lines(scheduler: dict | None) -> list[str]:
    """The budget the token-budget rule judged, and where each number came from (a default of `vllm serve` on this
    machine's platform is not the serving GPU's: vLLM's defaults grow with device memory)."""
    if not scheduler:
        return []
    given = set(scheduler.get("given") or ())
    parts = [f"{name} {scheduler[name]}" + ("" if name in given else " (default)")
             for name in ("max_num_seqs", "max_num_batched_tokens")]
    line = "  scheduler " + ", ".join(parts) + f", chunked prefill {'on' if scheduler.get('chunked_prefill') else 'off'}"
    if len(given) < 2:
        line += (f"; defaults are `vllm serve`'s on this machine ({scheduler.get('platform') or '?'}) and grow with the"
                 " serving GPU's memory: pass --max-num-seqs and --max-num-batched-tokens as the server runs")
    return [line]


def _runner_line(runner: str) -> str:
    """Which runner's rules this report applied, said beside the runner a server here would serve with (vLLM 0.32:
    V2 is the CUDA default, the CPU build serves V1)."""
    from spectrace.doctor.diagnose import _platform_name

    other = "v1" if runner == "v2" else "v2"
    line = f"  runner  judged by the {runner.upper()} model runner's rules (--runner {other} for {other.upper()}'s)"
    platform = (_platform_name() or "").lower()
    if platform == "cpu":
        line += "; this CPU build of vLLM serves V1 by default"
        if runner != "v1":
            line += ": pass --runner v1 to judge the pair as a server here would run it"
    return line


def render_text(report: Report) -> str:
    lines = [
        f"spectrace doctor (vLLM {report.vllm_version})",
        _runner_line(report.runner),
        f"  target  {report.target}  [{report.architectures.get('target') or '?'}]",
        f"  draft   {report.draft}  [{report.architectures.get('draft') or '?'}]",
        f"  method  {report.method or '?'} ({'given' if report.method_given else 'inferred by vLLM'}), "
        f"num_speculative_tokens {report.num_speculative_tokens}, max_model_len {report.max_model_len or '?'}",
        *_scheduler_lines(report.scheduler),
        "",
    ]
    for role in ("draft", "target"):
        rows = report.layout.get(role) or []
        if not rows:
            continue
        rule = report.rules.get(role)
        lines.append(f"{role} attention layout" + (f" (rule: {rule})" if rule else "") + ":")
        lines.append(_layout_table(rows))
        lines.append("")
    if report.taps is not None:
        lines.extend(_taps_lines(report))
        lines.append("")
    if report.models:
        lines.extend(_models_lines(report))
        lines.append("")
    if not report.findings:
        lines.append("no findings: vLLM builds this pair as declared.")
    else:
        lines.append("findings:")
        # each root cause, then what follows from it (caused_by), indented
        codes = {f.code for f in report.findings if f.caused_by is None}
        shown: set[int] = set()
        for root in report.findings:
            if id(root) in shown or (root.caused_by is not None and root.caused_by in codes):
                continue
            shown.add(id(root))
            lines.extend(_finding_lines(root, indent="  "))
            for consequence in report.findings:
                if id(consequence) not in shown and root.caused_by is None and consequence.caused_by == root.code:
                    shown.add(id(consequence))
                    lines.extend(_finding_lines(consequence, indent="      "))
    errors = sum(f.severity == "error" for f in report.findings)
    warns = sum(f.severity == "warning" for f in report.findings)
    infos = sum(f.severity == "info" for f in report.findings)
    lines.append("")
    lines.append(f"{errors} error(s), {warns} warning(s), {infos} info ({report.seconds:.1f}s, no engine started)")
    return terminal("\n".join(lines) + "\n")  # config.json's strings are someone else's: no control reaches a terminal


def _taps_lines(report: Report) -> list[str]:
    taps = report.taps or {}

    def ids(value: Any) -> str:
        return listed(value)  # "-" for none; a config's million ids cut with a count

    declared = (
        f"{taps['declared_field']} = {ids(taps['declared_ids'])}" if taps.get("declared_field") else "nothing (no layer ids)"
    )
    inputs = taps.get("input_taps")
    return [
        f"Hidden-state taps ({report.runner.upper()} model runner):",
        f"  declared  {declared}",
        f"  expected  {ids(taps.get('expected_ids'))}",
        f"  tapped    {ids(taps.get('tapped_ids'))}",
        f"  fc input  {'?' if inputs is None else f'{inputs} tap(s)'}",
        f"  status    {taps.get('status')}",
        f"  captures  {taps.get('capture_point') or 'not recognised in the target model code'}"
        + (f" ({taps['capture_rule']})" if taps.get("capture_rule") else ""),
        f"  vLLM rule: {taps.get('vllm_rule')}",
    ]


def _finding_lines(finding: Any, *, indent: str) -> list[str]:
    role = finding.model_role or "-"
    caused = f" (caused by {finding.caused_by})" if finding.caused_by else ""
    out = [f"{indent}{finding.severity.upper():7s} {finding.code} [{role}]{caused}: {finding.message}"]
    if finding.fix:
        out.append(f"{indent}        fix: {finding.fix}")
    rule = finding.evidence.get("vllm_rule") if isinstance(finding.evidence, dict) else None
    if rule:
        out.append(f"{indent}        vLLM rule: {rule}")
    return out


def _models_lines(report: Report) -> list[str]:
    """Per model: its checkpoint (safetensors headers), dtype declared and run, RoPE, the drafter's dry load."""
    out = ["Models (checkpoint from safetensors headers; dtype declared -> run; RoPE resolved):"]
    for role in ("target", "draft"):
        facts = report.models.get(role)
        if not facts:
            continue
        checkpoint = facts.get("checkpoint") or {}
        if checkpoint.get("error"):
            weights = f"checkpoint: {checkpoint['error']}"
        else:
            dtypes = ", ".join(f"{k} {v}" for k, v in (checkpoint.get("dtypes") or {}).items())
            weights = f"{checkpoint.get('tensors')} tensors in {checkpoint.get('files')} file(s) ({dtypes})"
        rope = facts.get("rope") or {}
        rope_text = (
            f"rope {rope.get('rope_type')} theta {rope.get('theta') if rope.get('theta') is not None else 'unset (10000)'}"
            + (f" factor {rope.get('factor')}" if rope.get("factor") else "")
            if rope
            else "rope ?"
        )
        out.append(
            f"  {role:7s} {weights}; dtype {facts.get('declared_dtype') or '?'} -> {facts.get('runs_in') or '?'}; {rope_text}"
        )
        if role == "draft" and facts.get("dry_load"):
            loaded = f", {facts.get('loaded')} of {facts.get('parameters')} parameters filled" if facts.get("dry_load") == "ok" else ""
            out.append(f"          dry load: {facts['dry_load']}{loaded}")
    return out
