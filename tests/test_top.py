"""`spectrace top` without a terminal: pages exposed by spectrace's own instruments (plus vLLM's counters)
served over HTTP, windows between two scrapes, several URLs summed, a store, and bad input (one line,
exit 2). The live view in a real terminal: tests/test_top_tmux.py; against a real `vllm serve`:
tests/test_serve_metrics_live.py."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from spectrace import top
from spectrace.cli import main

LABELS = {"model": "t", "draft_model": "d", "method": "eagle3", "run_id": "r"}


def spectrace_page(drafted, accepted, lengths=None, k=3, findings=(), slices=None, ranks=None, speedup=None, by_k=None):
    """A page as a traced process exposes it: spectrace's instruments fed these counts, through the
    OpenTelemetry Prometheus reader the ``prometheus`` sink uses."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import CollectorRegistry, generate_latest

    from spectrace.sinks.metrics import Metrics

    registry = CollectorRegistry(auto_describe=False)
    m = Metrics([PrometheusMetricReader(registry=registry, disable_target_info=True)], Resource.create({}))
    try:
        m.verify_counts([{"position": p, "context_bucket": "0-512", "drafted": d, "accepted": a}
                         for p, (d, a) in enumerate(zip(drafted, accepted))], LABELS)
        if lengths:
            m.acceptance_lengths(list(lengths), list(lengths.values()), k, LABELS)
        for code, severity, role in findings:
            m.finding(code, severity, role, LABELS)
        if slices:
            m.slices(slices, LABELS)
        for rank, (d, a) in (ranks or {}).items():
            m.worker_counts(d, a, rank, LABELS)
        if speedup is not None:
            m.speculation(1, 10**6, 10**5, 1, 2, 0, LABELS)
            m.speedup_estimate(speedup, 0, LABELS)
        if by_k:
            m.speedup_by_k([{"k": kk, "speedup": v, "extrapolated": kk > k} for kk, v in by_k.items()], 0, LABELS)
        return generate_latest(registry).decode()
    finally:
        m.shutdown()


def vllm_page(drafts, accepted_per_pos):
    lines = ["# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.",
             "# TYPE vllm:spec_decode_num_drafts counter",
             f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="t"}} {float(drafts)}',
             "# HELP vllm:spec_decode_num_accepted_tokens Number of accepted tokens.",
             "# TYPE vllm:spec_decode_num_accepted_tokens counter",
             f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="t"}} {float(sum(accepted_per_pos))}',
             "# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens per draft position.",
             "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="t",position="{p}"}} {float(a)}'
              for p, a in enumerate(accepted_per_pos)]
    return "\n".join(lines) + "\n"


class Pages:
    """A loopback HTTP server: path -> the list of bodies it serves, one per request (the last one repeats)."""

    def __init__(self):
        self.bodies: dict[str, list[tuple[str, str]]] = {}
        pages = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                queue = pages.bodies.get(self.path)
                if not queue:
                    self.send_error(404)
                    return
                ctype, body = queue.pop(0) if len(queue) > 1 else queue[0]
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path):
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def serve(self, path, *bodies, ctype="text/plain; version=0.0.4"):
        self.bodies[path] = [(ctype, b) for b in bodies]
        return self.url(path)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def pages():
    p = Pages()
    yield p
    p.close()


# position 0 healthy, position 1 accepts almost none of what 0 accepted: a cliff after position 0
DRAFTED, ACCEPTED = [400, 400, 400], [320, 10, 5]
LENGTHS = {1: 80, 2: 310, 3: 5, 4: 5}


def test_one_page_lifetime_frame(pages):
    body = spectrace_page(DRAFTED, ACCEPTED, LENGTHS, findings=[("TAP_MISMATCH", "error", "draft")],
                          ranks={0: (1200, 335)}, speedup=0.8, by_k={0: 1.0, 1: 1.31, 4: 0.7}) + vllm_page(400, ACCEPTED)
    source = top.MetricsSource([pages.serve("/metrics", body).removesuffix("/metrics")], window_s=60)
    frame = source.frame()
    assert frame.scope == "lifetime (one scrape)" and frame.sources == [pages.url("/metrics")]
    assert [(p.position, p.drafted, p.accepted) for p in frame.positions] == [(0, 400, 320), (1, 400, 10), (2, 400, 5)]
    assert [p.rate for p in frame.positions] == [0.8, 0.025, 0.0125]
    assert [p.vllm_rate for p in frame.positions] == [0.8, 0.025, 0.0125]  # vLLM's counter over its drafts
    assert frame.cliff == 0
    assert frame.lengths == {1: 80, 2: 310, 3: 5, 4: 5}
    assert frame.mean_length == pytest.approx((80 + 620 + 15 + 20) / 400)
    assert frame.speedup == 0.8 and frame.break_even == pytest.approx(frame.mean_length / 0.8)
    assert frame.speedup_by_k == {0: (1.0, False), 1: (1.31, False), 4: (0.7, True)}
    from spectrace.audit.codes import REGISTRY

    assert frame.findings == [("error", "TAP_MISMATCH", "draft", REGISTRY["TAP_MISMATCH"].fix)]
    assert frame.ranks == [("rank 0", 1200, 335)]
    text = top.plain(frame)
    assert "◀ cliff" in text.splitlines()[[i for i, l in enumerate(text.splitlines()) if l.lstrip().startswith("0 ")][0]]
    assert "TAP_MISMATCH" in text and REGISTRY["TAP_MISMATCH"].fix[:40] in " ".join(text.split())
    assert "\x1b" not in text and all(line == line.rstrip() for line in text.splitlines())


def test_window_is_what_counters_gained_between_scrapes(pages):
    first = spectrace_page(DRAFTED, ACCEPTED, LENGTHS)
    second = spectrace_page([500, 480, 470], [400, 20, 9], {1: 90, 2: 380, 3: 10, 4: 20})
    url = pages.serve("/metrics", first, second)
    source = top.MetricsSource([url], window_s=0)
    source.frame()
    frame = source.frame()
    assert frame.scope.startswith("last ")
    assert [(p.drafted, p.accepted) for p in frame.positions] == [(100, 80), (80, 10), (70, 4)]
    assert frame.lengths == {1: 10, 2: 70, 3: 5, 4: 15}
    assert frame.cliff is None  # position 1 drafted 80 in the window: under the rule's 100 tokens
    # a counter that fell (the process restarted) counts from zero in the window
    assert top.window({(0, "x_total", ()): 5.0}, {(0, "x_total", ()): 50.0}) == {(0, "x_total", ()): 5.0}
    assert top.window({(0, "g", ()): 5.0}, {(0, "g", ()): 50.0}) == {(0, "g", ()): 5.0}  # gauges as they are


def test_several_urls_are_summed_with_a_row_each(pages):
    a = pages.serve("/a/metrics", spectrace_page([100, 100], [90, 45]))
    b = pages.serve("/b/metrics", spectrace_page([300, 300], [150, 30]))
    frame = top.MetricsSource([a, b], window_s=60).frame()
    assert [(p.drafted, p.accepted) for p in frame.positions] == [(400, 240), (400, 75)]
    assert frame.ranks == [(a, 200, 135), (b, 600, 180)]


def test_vllm_counters_alone(pages):
    url = pages.serve("/metrics", vllm_page(200, [150, 90, 30]))
    frame = top.MetricsSource([url], window_s=60).frame()
    assert frame.vllm_source
    assert [(p.drafted, p.accepted, p.vllm_rate) for p in frame.positions] == [(200, 150, 0.75), (200, 90, 0.45), (200, 30, 0.15)]
    assert frame.mean_length == 1 + 270 / 200


def test_once_prints_one_plain_frame(pages, capsys):
    url = pages.serve("/metrics", spectrace_page(DRAFTED, ACCEPTED, LENGTHS) + vllm_page(400, ACCEPTED))
    assert main(["top", url, "--once"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"spectrace top  {url}  ·  lifetime (one scrape)\n")
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert rows[:3] == [["0", "400", "320", "80.0%", "████████████████", "—", "80.0%", "◀", "cliff"],
                        ["1", "400", "10", "2.5%", "█", "3.1%", "2.5%"], ["2", "400", "5", "1.2%", "█", "50.0%", "1.2%"]]
    assert "cliff: position 1 accepts under 5 % of what position 0 accepted" in out


def test_store_frame(tmp_path, capsys):
    from spectrace.testing import store_pipeline

    now = time.time_ns()
    pipe = store_pipeline(tmp_path / "store", retention_s=0, compact_interval_s=0)
    pipe.append("runs", {"run_id": "old", "method": "eagle3", "started_at": now - 10**12})
    pipe.append("runs", {"run_id": "r1", "method": "eagle3", "started_at": now})
    pipe.extend("verify_counts", [{"run_id": "r1", "source": src, "rank": 0, "position": p, "drafted": 200, "accepted": a,
                                   "ts": now} for src in ("engine_core", "worker") for p, a in enumerate([150, 100])])
    pipe.extend("acceptance_lengths", [{"run_id": "r1", "source": "engine_core", "length": n, "count": c, "ts": now}
                                       for n, c in ((1, 50), (2, 50), (3, 100))])
    pipe.append("findings", {"run_id": "r1", "code": "SWA_DROPPED", "severity": "error", "model_role": "draft",
                             "fix": "add use_sliding_window", "ts": now})
    pipe.flush()
    frame = top.StoreSource(str(tmp_path / "store"), 60).frame()
    assert frame.scope == "run r1, last 60s"
    assert [(p.position, p.drafted, p.accepted) for p in frame.positions] == [(0, 200, 150), (1, 200, 100)]
    assert frame.lengths == {1: 50, 2: 50, 3: 100} and frame.mean_length == 2.25
    assert frame.findings == [("error", "SWA_DROPPED", "draft", "add use_sliding_window")]
    assert frame.ranks == [("rank 0", 400, 250)]
    assert main(["top", "--dir", str(tmp_path / "store"), "--run", "old", "--once"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # (a long store path wraps the header)
    assert "run old, whole run (nothing in the last 60s)" in out and "no drafts verified yet" in out


@pytest.mark.parametrize("case", ["unreachable", "html", "json", "404", "no runs", "no store", "not a url", "both"])
def test_bad_input_is_one_line_and_exit_2(case, pages, tmp_path, capsys):
    if case == "unreachable":
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed once the block ends: nothing listens there
        argv, expect = [f"127.0.0.1:{port}"], f"cannot reach http://127.0.0.1:{port}/metrics"
    elif case == "html":
        argv, expect = [pages.serve("/login", "<!DOCTYPE html><html><body>Grafana</body></html>", ctype="text/html")], "not Prometheus text"
    elif case == "json":
        argv, expect = [pages.serve("/metrics", '{"status": "ok"}')], "not Prometheus text"
    elif case == "404":
        argv, expect = [pages.url("/nothing")], "HTTP 404"
    elif case == "no runs":
        from spectrace.testing import store_pipeline

        pipe = store_pipeline(tmp_path / "empty")  # a store with rows, but no engine ever started
        pipe.append("hooks", {"run_id": "x", "hook": "worker.verify", "status": "installed", "ts": time.time_ns()})
        pipe.flush()
        argv, expect = ["--dir", str(tmp_path / "empty")], "no runs in the store"
    elif case == "no store":
        argv, expect = ["--dir", str(tmp_path / "absent")], "no store at"
    elif case == "not a url":
        argv, expect = ["ftp://host/x"], "is not an http(s) URL"
    else:
        argv, expect = [pages.url("/metrics"), "--dir", str(tmp_path)], "give URLs or --dir, not both"
    assert main(["top", *argv, "--once"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("spectrace: error: ") and expect in captured.err, captured.err


def test_store_frame_shows_the_active_findings_only(tmp_path):
    """A collapse that recovered is not active (spectrace.audit.rules.active, as on /metrics); one after it is."""
    from spectrace.testing import store_pipeline

    now = time.time_ns()
    pipe = store_pipeline(tmp_path / "store", retention_s=0, compact_interval_s=0)
    pipe.append("runs", {"run_id": "r1", "method": "eagle3", "started_at": now})
    for i, (code, severity) in enumerate([("SWA_DROPPED", "error"), ("ACCEPTANCE_COLLAPSE", "error"),
                                          ("ACCEPTANCE_RECOVERED", "info")]):
        pipe.append("findings", {"run_id": "r1", "code": code, "severity": severity, "model_role": "draft", "ts": now + i})
    pipe.flush()
    frame = top.StoreSource(str(tmp_path / "store"), 60).frame()
    assert [f[:3] for f in frame.findings] == [("error", "SWA_DROPPED", "draft")]
    pipe.append("findings", {"run_id": "r1", "code": "ACCEPTANCE_COLLAPSE", "severity": "error", "model_role": "draft",
                             "ts": now + 3})
    pipe.flush()
    frame = top.StoreSource(str(tmp_path / "store"), 60).frame()
    assert [f[:3] for f in frame.findings] == [("error", "ACCEPTANCE_COLLAPSE", "draft"), ("error", "SWA_DROPPED", "draft")]
