"""`spectrace diff A B`: two stores (a drafter before and after a fix) and two runs of one store, compared
per position, context range and slice with 95 % intervals, the mean length and the findings that differ;
bad input is one line and exit 2."""

from __future__ import annotations

import json
import time

import pytest

from spectrace import diff
from spectrace.cli import main
from spectrace.audit.rules.slices import wilson


def _write(root, run_id, positions, ranges, slices, lengths, findings, started=None):
    """A store holding one run: ``positions`` [(drafted, accepted)], ``ranges`` {range: [(d, a)] per position},
    ``slices`` [(request_id, {dimension: value}, drafted, accepted)], ``lengths`` {length: count}."""
    from spectrace.testing import store_pipeline

    now = time.time_ns()
    pipe = store_pipeline(root, retention_s=0, compact_interval_s=0)
    pipe.append("runs", {"run_id": run_id, "method": "eagle3", "num_speculative_tokens": len(positions),
                         "draft_model": f"drafter-{run_id}", "started_at": started or now})
    pipe.extend("verify_counts", [{"run_id": run_id, "source": "engine_core", "position": p, "context_range": name,
                                   "drafted": d, "accepted": a, "ts": now}
                                  for name, per_pos in ranges.items() for p, (d, a) in enumerate(per_pos)])
    assert [tuple(map(sum, zip(*(per_pos[p] for per_pos in ranges.values())))) for p in range(len(positions))] == positions
    pipe.extend("request_slices", [{"run_id": run_id, "request_id": rid, "slice": json.dumps(s), "ts": now}
                                   for rid, s, _, _ in slices])
    pipe.extend("request_counts", [{"run_id": run_id, "request_id": rid, "request_steps": d // len(positions),
                                    "drafted": d, "accepted": a, "ts": now} for rid, _, d, a in slices])
    pipe.extend("acceptance_lengths", [{"run_id": run_id, "source": "engine_core", "length": n, "count": c, "ts": now}
                                       for n, c in lengths.items()])
    pipe.extend("findings", [{"run_id": run_id, "code": c, "severity": s, "model_role": "draft", "ts": now}
                             for c, s in findings])
    pipe.flush()


BEFORE = dict(
    positions=[(300, 150), (300, 30), (300, 6)],
    ranges={"0-64": [(200, 140), (200, 28), (200, 6)], "64-512": [(100, 10), (100, 2), (100, 0)]},
    slices=[("r1", {"temperature": "greedy"}, 450, 120), ("r2", {"temperature": "0-0.5"}, 450, 66)],
    lengths={1: 150, 2: 120, 3: 24, 4: 6},
    findings=[("SWA_DROPPED", "error"), ("LAYOUT_MISMATCH", "info"), ("CAUSAL_INFERRED", "warning")],
)
AFTER = dict(
    positions=[(300, 240), (300, 180), (300, 120)],
    ranges={"0-64": [(200, 160), (200, 120), (200, 80)], "64-512": [(100, 80), (100, 60), (100, 40)]},
    slices=[("r1", {"temperature": "greedy"}, 450, 300), ("r2", {"temperature": "0-0.5"}, 450, 240)],
    lengths={1: 60, 2: 60, 3: 60, 4: 120},
    findings=[("CAUSAL_INFERRED", "warning")],
)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff")
    _write(root / "before", "before", **BEFORE)
    _write(root / "after", "after", **AFTER)
    return root


def test_two_stores_compared(stores):
    a = diff.load("A", *diff.resolve(str(stores / "before"), "unused"))
    b = diff.load("B", *diff.resolve(str(stores / "after"), "unused"))
    assert (a.run_id, b.run_id, a.k, b.k) == ("before", "after", 3, 3)
    assert a.positions == {0: (300, 150), 1: (300, 30), 2: (300, 6)}
    assert b.ranges == {"0-64": (600, 360), "64-512": (300, 180)}
    assert a.slices == {("temperature", "greedy"): (1, 450, 120), ("temperature", "0-0.5"): (1, 450, 66)}
    assert a.mean_length == (150 + 240 + 72 + 24) / 300 and b.mean_length == (60 + 120 + 180 + 480) / 300
    text = diff.render(a, b)
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line[:2] in ("0 ", "1 ", "2 ")}
    low, high = wilson(150, 300, 1)
    assert rows["0"] == ["300", "50.0%", f"{low:.1%}–{high:.1%}", "300", "80.0%",
                         "{:.1%}–{:.1%}".format(*wilson(240, 300, 1)), "+30.0", "pts", "apart"]
    assert rows["2"][-3:] == ["+38.0", "pts", "apart"]
    # by context range, a request-step's k = 3 drafts are one trial: wider intervals than per token
    line = next(l for l in text.splitlines() if l.startswith("64-512"))
    assert "{:.1%}–{:.1%}".format(*wilson(12, 300, 3)) in line and line.split()[-3:] == ["+56.0", "pts", "apart"]
    line = next(l for l in text.splitlines() if l.startswith("temperature") and "greedy" in l)
    assert line.split()[2:4] == ["450", "26.7%"] and line.split()[-3:] == ["+40.0", "pts", "apart"]
    assert "Mean acceptance length: A 1.620 over 300 request-steps, B 2.800 over 300 request-steps; B - A +1.180" in text
    assert text.endswith("Findings that differ\n  only in A  error   SWA_DROPPED [draft]\n  only in A  info    LAYOUT_MISMATCH [draft]\n")


def test_runs_of_one_store_and_the_cli(stores, tmp_path, capsys):
    one = tmp_path / "one"
    _write(one, "r-old", **BEFORE, started=time.time_ns() - 10**12)
    _write(one, "r-new", **BEFORE)
    assert main(["diff", "--dir", str(one), "r-old", "r-new"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith(f"  A  run r-old in {one}: eagle3, k = 3, draft drafter-r-old")
    assert "+0.0 pts  overlap" in out and out.endswith("Findings: the same in both runs\n")
    assert main(["diff", str(stores / "before"), str(one)]) == 0  # a store's latest run: r-new
    assert "  B  run r-new in" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["unknown run", "empty dir", "no runs", "missing dir"])
def test_bad_input_is_one_line_and_exit_2(case, stores, tmp_path, capsys):
    if case == "unknown run":
        argv, expect = ["--dir", str(stores / "before"), "before", "nope"], "'nope' is neither a store directory nor a run in the store at"
    elif case == "empty dir":
        (tmp_path / "empty").mkdir()
        argv, expect = [str(tmp_path / "empty"), str(stores / "after")], "holds no records yet"
    elif case == "no runs":
        from spectrace.testing import store_pipeline

        pipe = store_pipeline(tmp_path / "hooks-only")
        pipe.append("hooks", {"run_id": "x", "hook": "worker.verify", "status": "installed", "ts": time.time_ns()})
        pipe.flush()
        argv, expect = [str(stores / "before"), str(tmp_path / "hooks-only")], "no runs in the store at"
    else:
        argv, expect = ["--dir", str(tmp_path / "absent"), "a", "b"], "'a' is neither a store directory nor a run (no store at"
    assert main(["diff", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and expect in captured.err, captured.err


def test_two_scrapes(capsys):
    """A and B as /metrics URLs: one scrape each, the counters since the processes started."""
    from test_top import Pages, spectrace_page

    pages = Pages()
    try:
        a = pages.serve("/a/metrics", spectrace_page([400, 400, 400], [320, 10, 5], {1: 80, 2: 310, 3: 5, 4: 5},
                                                     findings=[("TAP_MISMATCH", "error", "draft")]))
        b = pages.serve("/b/metrics", spectrace_page([400, 400, 400], [320, 240, 160], {1: 80, 2: 80, 3: 80, 4: 160}))
        assert main(["diff", a, b]) == 0
    finally:
        pages.close()
    out = capsys.readouterr().out
    assert f"  A  run (scrape) scraped from {a}: ?, k = 3, draft ?" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:2] in ("0 ", "1 ", "2 ")}
    assert rows["0"][-3:] == ["+0.0", "pts", "overlap"] and rows["1"][:2] == ["400", "2.5%"]
    assert rows["1"][3:5] == ["400", "60.0%"] and rows["1"][-3:] == ["+57.5", "pts", "apart"]
    assert "Mean acceptance length: A 1.837 over 400 request-steps, B 2.800 over 400 request-steps" in out
    assert out.endswith("Findings that differ\n  only in A  error   TAP_MISMATCH [draft]\n")
