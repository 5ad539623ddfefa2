"""Hardening 3, items 2-4: text from outside never reaches a terminal as a command, a page is data, a planted segment
is one named file. Real processes: the `spectrace` CLI as a subprocess (the bytes it writes are asserted), a real
HTTP server on 127.0.0.1 feeding hostile pages (and one that sends a byte a second), stores written by the real
segment writer with a planted file beside them. (The live view in tmux: tests/test_top_tmux.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spectrace.testing import store_pipeline
from test_top import ACCEPTED, DRAFTED, LENGTHS, Pages, spectrace_page, vllm_page

REPO = Path(__file__).resolve().parents[1]
OSC = "\x1b]2;PWNED\x1b\\\x1b[2J"  # retitles the window, then clears the screen
# the same as a label value on a Prometheus page (a backslash is written \\ there)
OSC_LABEL = OSC.replace("\\", "\\\\")


def _cli(*argv, timeout=60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("COLUMNS", "LINES", "SPECTRACE"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "spectrace.cli", *argv], capture_output=True, timeout=timeout, env=env)


def _no_control(data: bytes) -> None:
    text = data.decode()
    bad = sorted({c for c in text if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f})
    assert not bad, (bad, text)


def hostile_page() -> str:
    extra = "\n".join([
        "# TYPE spectrace_config_finding gauge",
        f'spectrace_config_finding{{code="TAP{OSC_LABEL}",severity="error",model_role="draft\\n  ERROR FAKE\r[/]"}} 1',
        "# TYPE spectrace_slice_drafted_tokens_total counter",
        f'spectrace_slice_drafted_tokens_total{{dimension="temperature",value="[red]x[/]{OSC_LABEL}"}} 300',
        "# TYPE spectrace_slice_accepted_tokens_total counter",
        f'spectrace_slice_accepted_tokens_total{{dimension="temperature",value="[red]x[/]{OSC_LABEL}"}} 30',
        "# TYPE spectrace_run_info gauge",
        f'spectrace_run_info{{run_id="r{OSC_LABEL}\\nFAKE",method="eagle3[/]",num_speculative_tokens="x",draft_model="d\r"}} 1',
    ])
    return spectrace_page(DRAFTED, ACCEPTED, LENGTHS) + extra + "\n"


def test_hostile_labels_reach_top_and_diff_escaped_never_as_markup(tmp_path):
    pages = Pages()
    try:
        url = pages.serve("/metrics", hostile_page())
        clean = pages.serve("/clean", spectrace_page(DRAFTED, ACCEPTED, LENGTHS))
        done = _cli("top", url, "--once")
        assert done.returncode == 0, done.stderr
        _no_control(done.stdout)
        out = done.stdout.decode()
        assert "TAP\\x1b]2;PWNED\\x1b\\\\x1b[2J" in out  # shown, escaped: the title never changes, nothing is cleared
        assert "[red]x[/]" in out and "draft\\n  ERROR FAKE\\r[/]" in out.replace("\n", "")  # text, not markup
        done = _cli("diff", url, clean)
        assert done.returncode == 0, done.stderr
        _no_control(done.stdout)
        out = done.stdout.decode()
        header = out.splitlines()[1]
        assert "run r\\x1b]2;PWNED\\x1b\\\\x1b[2J\\nFAKE scraped from" in header and "draft d\\r" in header
        assert "only in A  error   TAP\\x1b]2;PWNED" in out
    finally:
        pages.close()


def test_a_page_of_values_no_counter_holds_is_one_counted_note_never_a_traceback():
    bad = "\n".join([
        "# TYPE spectrace_verify_drafted_tokens_total counter",
        'spectrace_verify_drafted_tokens_total{position="0"} NaN',
        'spectrace_verify_drafted_tokens_total{position="1"} +Inf',
        'spectrace_verify_drafted_tokens_total{position="x"} 40',
        'spectrace_verify_drafted_tokens_total{position="2"} -5',
        'spectrace_verify_drafted_tokens_total{position="3"} 2.5',
        "# TYPE spectrace_verify_accepted_tokens_total counter",
        'spectrace_verify_accepted_tokens_total{position="0"} 10',
        "# TYPE spectrace_verify_acceptance_length histogram",
        'spectrace_verify_acceptance_length_bucket{le="nan"} 3',
        "# TYPE spectrace_speculation_speedup_by_k gauge",
        'spectrace_speculation_speedup_by_k{k="two"} 1.5',
        "# TYPE spectrace_worker_verified_drafted_tokens_total counter",
        'spectrace_worker_verified_drafted_tokens_total{rank="-1"} 4',
    ]) + "\n"
    pages = Pages()
    try:
        url = pages.serve("/metrics", bad + vllm_page(400, ACCEPTED))
        for argv in (("top", url, "--once"), ("diff", url, url)):
            done = _cli(*argv)
            err, out = done.stderr.decode(), done.stdout.decode()
            assert done.returncode == 0 and "Traceback" not in err + out, (argv, err, out)
            flat = " ".join(out.split())
            # one counted note per scrape (diff: one per run), naming the URL and the first series left out
            assert flat.count(f"{url}: 8 series left out") == (1 if argv[0] == "top" else 2), out
            assert 'the first: spectrace_verify_drafted_tokens_total{position="0"}: value nan' in flat, out
        done = _cli("top", url, "--once")
        # position 0 accepted 10 of no usable drafted count; vLLM's own counters are on the page: its rate is there
        assert "Acceptance by draft position" in done.stdout.decode()
    finally:
        pages.close()


class _Slow:
    """A server on 127.0.0.1 that sends a valid HTTP response one byte a second (headers, then body)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        body = spectrace_page(DRAFTED, ACCEPTED).encode()
        data = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn, data), daemon=True).start()

    def _drip(self, conn, data):
        try:
            conn.recv(4096)
            for i in range(len(data)):
                if self.stop.wait(1.0):
                    break
                conn.sendall(data[i:i + 1])
        except OSError:
            pass
        finally:
            conn.close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"

    def close(self):
        self.stop.set()
        self.sock.close()


@pytest.mark.slow  # it waits out the page deadline (10 s), twice
def test_a_server_sending_a_byte_a_second_holds_top_and_diff_no_longer_than_the_page_deadline():
    from spectrace.top import PAGE_DEADLINE_S

    slow = _Slow()
    try:
        for argv in (("top", slow.url, "--once"), ("diff", slow.url, slow.url)):
            began = time.monotonic()
            done = _cli(*argv)
            took = time.monotonic() - began
            err = done.stderr.decode().strip()
            assert done.returncode == 2 and err.count("\n") == 0, err
            assert f"{slow.url}: the page did not arrive within {PAGE_DEADLINE_S:g} s (connect and body)" in err
            assert PAGE_DEADLINE_S <= took < PAGE_DEADLINE_S + 8, took  # the interpreter's start, on a loaded machine
    finally:
        slow.close()


def test_a_page_past_the_size_cap_is_one_line():
    from spectrace.top import MAX_PAGE_BYTES

    pages = Pages()
    try:
        url = pages.serve("/metrics", "# " + "x" * (MAX_PAGE_BYTES + 10) + "\n")
        done = _cli("top", url, "--once")
        assert done.returncode == 2
        assert done.stderr.decode().strip() == f"spectrace: error: {url}: the page is larger than 16 MiB; not read"
    finally:
        pages.close()


def _store_with_hostile_values(root: Path) -> None:
    writer = store_pipeline(root, retention_s=0, compact_interval_s=0)
    writer.append("runs", {"run_id": "r1", "process_role": "frontend", "started_at": 1, "target_model": f"t{OSC}",
                           "method": "draft_model", "num_speculative_tokens": 3})
    for i, rid in enumerate([f"q0\r  FAKE ROW 100.0%", f"q1{OSC}", "q2[/]", "q3\n  FAKE LINE"]):
        writer.append("request_counts", {"run_id": "r1", "process_role": "engine_core", "ts": 3, "request_id": rid,
                                         "request_steps": 20, "drafted": 60, "accepted": 6 * i,
                                         "histogram": json.dumps([20 - i, i, 0, 0])})
        writer.append("findings", {"run_id": "r1", "process_role": "engine_core", "ts": 3, "code": "TAP_MISMATCH",
                                   "severity": "error", "model_role": "draft", "message": f"planted {OSC}\r\nFAKE",
                                   "fix": "[/]"})
    writer.flush()


def _plant_histogram(root: Path) -> Path:
    folder = next((root / "request_counts").iterdir())
    path = folder / "planted.parquet"
    good = pq.read_table(next(folder.glob("*.parquet")))
    bad = good.slice(0, 1).set_column(good.schema.get_field_index("histogram"), "histogram",
                                      pa.array(['["a", "b"]'], type=good.schema.field("histogram").type))
    pq.write_table(bad.set_column(good.schema.get_field_index("request_id"), "request_id", pa.array(["planted"])), path)
    os.chmod(path, 0o600)
    return path


def test_store_values_reach_report_and_query_escaped_and_a_planted_segment_is_one_named_file(tmp_path):
    store = tmp_path / "store"
    _store_with_hostile_values(store)
    planted = _plant_histogram(store)
    done = _cli("report", "--dir", str(store))
    err, out = done.stderr.decode(), done.stdout.decode()
    assert done.returncode == 0, err
    _no_control(done.stdout)
    assert "q0\\r  FAKE ROW" in out and "q3\\n  FAKE LINE" in out and "q1\\x1b]2;PWNED" in out
    assert err.count(str(planted)) == 1 and "histogram: 1 value(s) not BIGINT[]" in err, err
    done = _cli("query", "--dir", str(store), "select request_id, acceptance_histogram from request_spec_decode "
                "order by request_id")
    assert done.returncode == 0, done.stderr
    _no_control(done.stdout)
    out = done.stdout.decode()
    assert "planted" not in out and "q2[/]" in out and "(4 rows)" in out
    assert done.stderr.decode().count(str(planted)) == 1
    done = _cli("query", "--dir", str(store), "select message, fix from findings")
    assert done.returncode == 0 and "planted \\x1b]2;PWNED\\x1b\\\\x1b[2J\\r\\nFAKE" in done.stdout.decode()
    _no_control(done.stdout)


def test_diff_names_each_bad_file_once(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _store_with_hostile_values(a)
    _store_with_hostile_values(b)
    planted = _plant_histogram(a)
    done = _cli("diff", str(a), str(b))
    err = done.stderr.decode()
    assert done.returncode == 0, err
    _no_control(done.stdout)
    assert err.count(str(planted)) == 1, err
