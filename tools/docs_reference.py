"""The docs' reference pages, generated from the code (repo tooling, not shipped).

    python -m tools.docs_reference            rewrite docs/reference/*.md
    python -m tools.docs_reference --check    exit 1 (naming the pages) when a committed page differs

Pages and where each comes from:

- ``settings.md``  ``spectrace.settings.VARIABLES`` (defaults read off ``Settings``)
- ``codes.md``     ``spectrace.audit.codes.REGISTRY``
- ``metrics.md``   the instruments ``spectrace.sinks.metrics.Metrics`` creates, fed one sample of every kind and
                   exposed through the same OpenTelemetry Prometheus reader the ``prometheus`` sink uses
- ``schema.md``    ``spectrace.records`` (tables, columns, types, and the comments beside them in records.py)
- ``versions.md``  the hooks' declared ranges and bench/results (``tools.versions_table``)

``tests/test_docs.py`` regenerates every page and compares it with the committed file.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
PAGES_DIR = REPO / "docs" / "reference"
REGENERATE = "python -m tools.docs_reference"


def _header(source: str) -> str:
    return (f"<!-- generated from {source} by `{REGENERATE}`; edit the code, not this page "
            "(tests/test_docs.py fails on drift) -->\n")


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# -- settings ---------------------------------------------------------------------------


def settings_page() -> str:
    from spectrace import settings

    lines = [
        _header("spectrace/settings.py (VARIABLES, Settings)"),
        "# Settings",
        "",
        "Every variable `spectrace.settings` reads, with the default the code uses and the range it checks. "
        "How a bad value is handled, durations and OTLP's own variables: [Enabling in production](../production.md).",
        "",
        "| variable | default | range | meaning |",
        "|---|---|---|---|",
    ]
    for v in settings.VARIABLES:
        lines.append(f"| `{v.name}` | {_cell(settings.documented_default(v))} | {_cell(v.range)} | {_cell(v.meaning)} |")
    lines += [
        "",
        f"A duration is `90s`, `15m`, `12h`, `7d`, `2w` or a bare number of seconds (`2.5`): {settings.DURATION_EXAMPLES}. "
        "*One path component*: a run id or host names folders and files of the store, so it may not hold `/`, `\\`, "
        f"NUL or control characters, be `.` or `..`, start with `.`, or be longer than {settings.PATH_PART_MAX} "
        "characters; such a value is refused, never rewritten.",
        "",
    ]
    return "\n".join(lines)


# -- finding codes ---------------------------------------------------------------------------


def codes_page() -> str:
    from spectrace.audit import codes

    lines = [
        _header("spectrace/audit/codes.py (REGISTRY, CAUSES)"),
        "# Finding codes",
        "",
        f"The {len(codes.REGISTRY)} codes spectrace emits. A code is stable once released: dashboards, alert rules "
        "and stored findings name it. Consequences of a root cause are `info` findings whose `caused_by` names it, "
        "so a misconfiguration reads as one error, not five. The failures seen in the field behind the codes: "
        "[Causes spectrace names](#causes-spectrace-names); how the findings are judged: "
        "[Findings and causes](../diagnosis.md).",
        "",
        "Severity is certainty: **error** when vLLM runs something other than what the checkpoint declares and the "
        "arithmetic changes; **warning** when it is likely to cost acceptance; **info** when it differs and is fine if "
        "the drafter was trained so. An info finding that the configs cannot settle says what would "
        "(`evidence.settled_by`); when the run's acceptance collapses in the shape it predicts, it is said again as a "
        "warning (`evidence.raised_by`). Each code's **severity** line below says when it is which "
        "([per code](../diagnosis.md#how-severities-are-judged)).",
        "",
        "| code | component | severity | meaning |",
        "|---|---|---|---|",
    ]
    for c in codes.REGISTRY.values():
        lines.append(f"| [`{c.code}`](#{c.code.lower()}) | {c.component} | {', '.join(c.severities)} | {_cell(c.meaning)} |")
    for c in codes.REGISTRY.values():
        lines += [
            "",
            f"## {c.code}",
            "",
            f"- **component**: `{c.component}`",
            f"- **severity**: {c.severity_text}",
            f"- **meaning**: {c.meaning}",
            f"- **fix**: {c.fix or '—'}",
        ]
        for cause in codes.CAUSES:
            if c.code in cause.codes:
                lines.append(f"- **seen in the field**: {cause.cause} ({cause.reports})")
    lines += [
        "",
        "## Causes spectrace names",
        "",
        "Silent failures seen in the field, each with the codes that name it and where it was reported.",
        "",
        "| cause | named by | reported |",
        "|---|---|---|",
    ]
    for cause in codes.CAUSES:
        lines.append(f"| {_cell(cause.cause)} | {_cell(cause.named_as)} | {_cell(cause.reports)} |")
    lines.append("")
    return "\n".join(lines)


# -- metrics -----------------------------------------------------------------------------------


def _exercise(m) -> None:
    """One sample through every method that feeds an instrument (the flush's calls, with made-up values)."""
    labels = {"model": "t", "draft_model": "d", "method": "eagle3", "run_id": "r"}
    m.verify_counts([{"position": 0, "context_bucket": "0-512", "drafted": 4, "accepted": 3}], labels)
    m.acceptance_lengths([1, 2], [1, 1], 2, labels)
    m.worker_counts(4, 3, 0, labels)
    m.speculation(1, 10**6, 10**5, 1, 2, 0, labels)
    m.speedup_estimate(1.5, 0, labels)
    m.speedup_by_k([{"k": 1, "speedup": 1.2, "extrapolated": False}], 0, labels)
    m.boundaries([{"model_role": "draft", "field": "max_position_embeddings", "tokens": 64}], labels)
    m.slices({("temperature", "0"): [4, 3]}, labels)
    m.draft_budget(4, 4, labels)
    m.step_shapes([{"batch_band": "1", "k": 2, "steps": 1, "k_switches": 0}], labels)
    m.finding("SWA_DROPPED", "error", "draft", labels)
    m.finding("ACCEPTANCE_COLLAPSE", "error", "draft", labels)
    m.layout([{"model_role": "draft", "layer_index": 0, "declared_type": "sliding", "runtime_type": "full",
               "runtime_window": None, "status": "MISMATCH"}], labels)
    m.taps([{"expected_id": 1, "tapped_id": 2}], labels)
    m.run_info({"num_speculative_tokens": 2, "model_runner": "v1"}, labels, "0.32.0", "0.1.0")
    m.errors({"worker.verify": 1})
    m.dropped.add(1)


def metric_rows() -> list[dict]:
    """One row per instrument: its name, kind, description, Prometheus series and labels (beyond the common ones)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from spectrace.sinks import metrics

    registry = CollectorRegistry(auto_describe=False)
    m = metrics.Metrics([PrometheusMetricReader(registry=registry, disable_target_info=True)], Resource.create({}))
    try:
        _exercise(m)
        instruments = list(m._meter._instrument_id_instrument.values())
        families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    finally:
        m.shutdown()
    rows = []
    for inst in sorted(instruments, key=lambda i: i.name):
        family = families.get(inst.name.replace(".", "_"))
        if family is None:
            raise SystemExit(f"docs_reference: instrument {inst.name} exposed no series: give it a sample in "
                             "tools/docs_reference.py _exercise()")
        kind = type(inst).__name__.lstrip("_").lower()  # counter, observablegauge, histogram, observablecounter
        kind = {"observablegauge": "gauge", "observablecounter": "counter"}.get(kind, kind)
        names = sorted({s.name for s in family.samples})
        label_names = sorted({k for s in family.samples for k in s.labels} - {"le"})
        extra = [k for k in label_names if k not in metrics.COMMON and not k.startswith("otel_scope_")]
        common = set(metrics.COMMON) <= set(label_names)
        rows.append({
            "instrument": inst.name, "kind": kind, "description": inst.description,
            "series": names, "labels": extra, "common": common,
        })
    return rows


def _name(name: str) -> str:
    """A metric's name as inline code that the site may break after a dot or an underscore, never inside a word."""
    import html

    return "<code>" + html.escape(name).replace(".", ".<wbr>").replace("_", "_<wbr>") + "</code>"


def metrics_page() -> str:
    from spectrace.sinks import metrics

    lines = [
        _header("the instruments of spectrace/sinks/metrics.py (Metrics), fed a sample and exposed"),
        "# Metrics",
        "",
        "Every OpenTelemetry instrument spectrace creates and the Prometheus series it becomes (on vLLM's own "
        "`/metrics`, on the standalone endpoint of offline engines and headless nodes, and through OTLP under the "
        "instrument's name). *common* is " + ", ".join(f"`{c}`" for c in metrics.COMMON)
        + "; on `/metrics` every series also carries `pid`, and `model_name` / `engine` as vLLM's own series do "
        "([Export](../export.md)); no OpenTelemetry scope labels (`otel_scope_*`). Counters are added to once per flush from aggregated counts; the engine's "
        "thread never touches an instrument.",
        "",
        "| instrument | kind | Prometheus series | labels | description |",
        "|---|---|---|---|---|",
    ]
    for r in metric_rows():
        labels = ", ".join(r["labels"]) + (" + common" if r["common"] else "")
        lines.append(
            f"| {_name(r['instrument'])} | {r['kind']} | {'<br>'.join(_name(n) for n in r['series'])} | "
            f"{_cell(labels.strip(' +') and labels or '—')} | {_cell(r['description'])} |"
        )
    lines += [
        "",
        f"`slice` series hold at most {metrics.MAX_SLICE_VALUES} values per dimension and process, then `other`. "
        "The acceptance-length histogram's buckets are `1` .. `k + 1` (the first run's k). `context_bucket` is one of "
        "`0-512`, `512-1k`, `1k-2k`, `2k-4k`, `4k-8k`, `8k-16k`, `16k+`; the store's `verify_counts.context_range` "
        "splits the same buckets at the run's own boundaries.",
        "",
    ]
    return "\n".join(lines)


# -- store schema ---------------------------------------------------------------------------


def _records_comments() -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """The comment lines above each table of records.TABLES, and the comment beside each column."""
    from spectrace import records

    source = Path(records.__file__).read_text(encoding="utf-8")
    table_notes: dict[str, str] = {}
    column_notes: dict[tuple[str, str], str] = {}
    pending: list[str] = []
    table = None
    last_column: tuple[int, str] | None = None
    in_tables = False
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string == "TABLES" and tok.start[1] == 0:
            in_tables = True
        if not in_tables:
            continue
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if last_column and last_column[0] == tok.start[0]:
                column_notes[(table, last_column[1])] = text
            else:
                pending.append(text)
        elif tok.type == tokenize.STRING:
            value = tok.string.strip("\"'")
            if value in records.TABLES and tok.start[1] <= 8:
                table = value
                if pending:
                    table_notes[table] = " ".join(pending)
                pending = []
            elif table and last_column is not None and last_column[0] == tok.start[0]:
                pass  # the column's type
            elif table:
                last_column = (tok.start[0], value)
        elif tok.type == tokenize.OP and tok.string == "}" and tok.start[1] == 0:
            break
    return table_notes, column_notes


def schema_page() -> str:
    from spectrace import records

    table_notes, column_notes = _records_comments()
    lines = [
        _header("spectrace/records.py (TABLES, COMMON)"),
        "# Store schema",
        "",
        f"Every table spectrace writes (schema version {records.SCHEMA_VERSION}), in the store, the lake and the "
        "Parquet segments. Types are DuckDB type names; `JSON` columns are stored as strings. Readers accept "
        "segments of every older schema version (missing columns read as NULL). The views over them: "
        "[The store](../store.md).",
        "",
        "Every row also carries: " + ", ".join(f"`{n}` ({t})" for n, t in records.COMMON) + ".",
        "",
        "| table | columns |",
        "|---|---|",
    ]
    for name, columns in records.TABLES.items():
        lines.append(f"| [`{name}`](#{name}) | {len(columns)} |")
    for name, columns in records.TABLES.items():
        lines += ["", f"## {name}", ""]
        if name in table_notes:
            lines += [table_notes[name], ""]
        lines += ["| column | type | note |", "|---|---|---|"]
        for column, dtype in columns:
            lines.append(f"| `{column}` | {dtype} | {_cell(column_notes.get((name, column), ''))} |")
    lines.append("")
    return "\n".join(lines)


# -- supported versions -----------------------------------------------------------------------


def versions_page() -> str:
    from spectrace.recorder.stages import all_hooks
    from tools import versions_table

    return "\n".join([
        _header("spectrace/recorder/support.py and bench/results (tools/versions_table.py)"),
        "# Supported vLLM versions",
        "",
        "Each hook, the vLLM site it wraps, the range it declares and what is checked when it installs; then every "
        "vLLM version run or checked (`make test-matrix`, `make check-vllm-0.33`, `make old-vllm`). How to read it: "
        "[Supported versions](../versions.md).",
        "",
        versions_table.readme_block(all_hooks(), versions_table.load_matrix(REPO)),
        "",
    ])


PAGES: dict[str, Callable[[], str]] = {
    "settings.md": settings_page,
    "codes.md": codes_page,
    "metrics.md": metrics_page,
    "schema.md": schema_page,
    "versions.md": versions_page,
}


def stale(pages_dir: Path = PAGES_DIR) -> list[str]:
    """The pages whose committed text differs from what the code generates."""
    return [name for name, make in PAGES.items()
            if not (pages_dir / name).is_file() or (pages_dir / name).read_text(encoding="utf-8") != make()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed page differs")
    parser.add_argument("pages", nargs="*", help=f"only these pages (default: all of {', '.join(PAGES)})")
    args = parser.parse_args(argv)
    names = args.pages or list(PAGES)
    if set(names) - set(PAGES):
        parser.error(f"no page {', '.join(sorted(set(names) - set(PAGES)))} (pages: {', '.join(PAGES)})")
    if args.check:
        bad = [n for n in stale() if n in names]
        if bad:
            print(f"docs/reference/{', '.join(bad)} stale: run {REGENERATE} and commit", file=sys.stderr)
            return 1
        return 0
    PAGES_DIR.mkdir(parents=True, exist_ok=True)
    for name in names:
        path, text = PAGES_DIR / name, PAGES[name]()
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"rewrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
