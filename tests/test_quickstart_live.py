"""The quickstart of docs/getting-started.md, run as written: its serve command (the zoo's target and DFlash drafter,
traced, through ``python -m vllm.entrypoints.openai.api_server`` on the CPU build), its requests with the real
``openai`` client, then its ``report``, ``top`` and ``query`` lines; and on that one run the speed-up is the same
figure in the report, in ``top`` and on ``/metrics`` (issue #57: one number per question).

The commands come from the page's marked blocks (``<!-- quickstart: NAME -->``); only the port changes (a free one
for 8000). They run in a scratch directory holding a link to the repository's ``spectrace`` folder, so that the
zoo's relative paths and ``./spectrace-data`` resolve there as in a clone's root.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from spectrace.testing import wait_until
from spectrace.testing.engine import base_env
from spectrace.testing.prometheus import free_port

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "getting-started.md"


def blocks() -> dict[str, str]:
    """The page's quickstart blocks by name: the fenced block after each ``<!-- quickstart: NAME -->``."""
    text = PAGE.read_text()
    found = re.findall(r"<!-- quickstart: (\w+) -->\n```\w*\n(.*?)```", text, re.S)
    return {name: body for name, body in found}


def test_the_page_marks_every_step():
    assert set(blocks()) == {"serve", "requests", "look", "again", "compare"}
    assert "python -m vllm.entrypoints.openai.api_server" in blocks()["serve"]
    assert "--kv-cache-memory-bytes" in blocks()["serve"] and "export SPECTRACE=1" in blocks()["serve"]


def _lines(block: str) -> list[str]:
    """The commands of a sh block: continuation lines joined, comments cut."""
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


class _Server:
    """A quickstart ``serve`` block running in ``here``: up on ``port`` once ``/health`` answers; ``stop()`` is
    Ctrl-C (vLLM's exit flushes the store), then a kill if it hangs."""

    def __init__(self, block: str, port: int, here: Path, env: dict, log_name: str):
        self.port, self.log_path = port, here / log_name
        self.log = open(self.log_path, "w")
        command = block.replace("--port 8000", f"--host 127.0.0.1 --port {port}")
        self.process = subprocess.Popen(["bash", "-c", command], cwd=here, env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

        def up():
            if self.process.poll() is not None:
                raise AssertionError(f"the quickstart's server exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
            except OSError:
                return False

        try:
            wait_until(up, 600, "the quickstart's server", interval_s=1.0)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()


def _requests(block: str, port: int, here: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", block.replace("127.0.0.1:8000", f"127.0.0.1:{port}")], cwd=here,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def quickstart(zoo, cache_root, tmp_path_factory):
    """The served quickstart: the server up, the requests' output, then each ``look`` command's output; then the
    second server of ``again``, the same requests, and the ``compare`` command's output."""
    steps = blocks()
    port = free_port()
    here = tmp_path_factory.mktemp("quickstart")
    (here / "spectrace").symlink_to(ROOT / "spectrace")
    env = base_env(None, traced=False, multiprocessing=True, cache_root=cache_root)
    env.pop("SPECTRACE", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    seen: dict = {"dir": here, "env": env}
    server = _Server(steps["serve"], port, here, env, "vllm.log")
    try:
        seen["requests"] = _requests(steps["requests"], port, here, env)
        seen["choices"] = subprocess.run([sys.executable, "-c", N_CHOICES.replace("PORT", str(port))], cwd=here,
                                         env=env, capture_output=True, text=True, timeout=300)
        export = next(line for line in _lines(steps["serve"]) if line.startswith("export "))

        def page() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                return response.read().decode()

        def settled():  # the store's figure and the gauge's agree once the last flush reached both
            report = _run(f"{export}; spectrace report", here, env)
            figure = _report_speedup(report.stdout)
            gauge = _gauge(page())
            return (report, gauge) if figure is not None and gauge is not None and round(gauge, 2) == figure[0] else None

        def stored_choices():  # the n=2 completion's engine requests in the store (a flush or two after they ended)
            rows = _run(f"{export}; spectrace query --format csv 'select count(*) from request_spec_decode'", here, env)
            return rows.returncode == 0 and int(rows.stdout.split()[-1]) >= 5

        try:  # (under a loaded suite a flush can lag: the waits are generous, and free when things are on time)
            wait_until(stored_choices, 180, "the five requests in the store", interval_s=2.0)
        except AssertionError:
            pass  # the tests below say what is missing
        try:
            seen["report"], seen["gauge"] = wait_until(settled, 180, "the report's speed-up and the gauge's to agree",
                                                       interval_s=3.0)
        except AssertionError:
            seen["report"], seen["gauge"] = _run(f"{export}; spectrace report", here, env), _gauge(page())
        seen["look"] = [(line, _run(f"{export}; {line.replace('127.0.0.1:8000', f'127.0.0.1:{port}')}", here, env))
                        for line in _lines(steps["look"])]
        seen["metrics"] = page()
    finally:
        server.stop()
    seen["log"] = (here / "vllm.log").read_text()
    # The second server stopped right after its requests, before its pipeline processes wrote anything (a flush
    # interval longer than the run): vLLM's Ctrl-C SIGKILLs the engine core's whole process tree at once
    # (--shutdown-timeout 0), and what the pipeline processes took must still reach the store (recorder.detached)
    again = _Server(steps["again"], port, here, {**env, "SPECTRACE_FLUSH_INTERVAL": "10m"}, "vllm-again.log")
    try:
        seen["again"] = _requests(steps["requests"], port, here, env)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            seen["again_vllm_drafted"] = sum(float(v) for v in re.findall(
                r"^vllm:spec_decode_num_draft_tokens_total(?:\{[^}]*\})? (\S+)$", response.read().decode(), re.M))
        time.sleep(2.0)  # a few ship intervals (0.25 s): everything the engine recorded has left it
    finally:
        again.stop()
    seen["again_stored"] = _run("spectrace query --dir ./spectrace-data-k5 --format csv "
                                "'select coalesce(sum(drafted), 0) from acceptance_by_position'", here, env)
    seen["compare"] = [(line, _run(line, here, env)) for line in _lines(steps["compare"])]
    return seen


# one completion with two choices (issue #57: the id the client saw, its choices told apart)
N_CHOICES = """
from openai import OpenAI
out = OpenAI(base_url="http://127.0.0.1:PORT/v1", api_key="unused").completions.create(
    model="spectrace/testing/zoo/target", prompt="abc abc abc", max_tokens=24, temperature=1.0, seed=7, n=2)
print(out.id, *sorted(c.index for c in out.choices))
"""


def _run(command: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def _report_speedup(text: str) -> tuple[float, int] | None:
    match = re.search(r"^  speed-up (\d+\.\d\d)x over the run's (\d+) steps that verified drafts \(estimate", text, re.M)
    return (float(match[1]), int(match[2])) if match else None


def _our_log(seen: dict) -> str:
    """spectrace's lines in the first server's log (what a failure message needs to say why)."""
    return "\n" + "\n".join(line for line in seen["log"].splitlines() if "spectrace" in line)[-4000:]


def _gauge(text: str) -> float | None:
    """The lowest worker rank's ``spectrace_speculation_speedup_estimate`` on the page."""
    values = []
    for labels, value in re.findall(r"^spectrace_speculation_speedup_estimate\{([^}]*)\} (\S+)$", text, re.M):
        rank = re.search(r'rank="(\d+)"', labels)
        values.append((int(rank[1]) if rank else -1, float(value)))
    return sorted(values)[0][1] if values else None


def test_the_requests_with_the_openai_client_answer(quickstart):
    done = quickstart["requests"]
    assert done.returncode == 0, done.stderr[-2000:]
    answers = done.stdout.splitlines()
    assert len(answers) == 3 and all(line.startswith("cmpl-") for line in answers), done.stdout
    assert "spectrace: tracing on in pid" in quickstart["log"]


def test_report_top_and_query_as_written(quickstart):
    for line, done in quickstart["look"]:
        assert done.returncode == 0, (line, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, line
    report, top, query = (done.stdout for _, done in quickstart["look"])
    assert "Acceptance by position" in report and "method    dflash" in report, report
    assert "speed-up" in top and "the run so far" in top, top
    rows = [line for line in query.splitlines()[2:] if line.strip() and not line.startswith("(")]
    assert rows and all("%" in line for line in rows), query  # rates rounded for reading


def test_one_speed_up_on_report_top_and_metrics(quickstart):
    """The same figure, its window and its basis, on the three surfaces of one finished run."""
    figure = _report_speedup(quickstart["report"].stdout)
    assert figure is not None, quickstart["report"].stdout
    value, steps = figure
    assert steps >= 10
    assert quickstart["gauge"] is not None and round(quickstart["gauge"], 2) == value, (quickstart["gauge"], _our_log(quickstart))
    top = quickstart["look"][1][1].stdout
    match = re.search(r"speed-up (\d+\.\d\d)x \(the run so far; estimate", top)
    assert match and float(match[1]) == value, (top, value)
    store_top = _run(f"{next(l for l in _lines(blocks()['serve']) if l.startswith('export '))}; spectrace top --once",
                     quickstart["dir"], quickstart["env"])
    match = re.search(r"speed-up (\d+\.\d\d)x \(the run so far", store_top.stdout)
    assert match and float(match[1]) == value, store_top.stdout + store_top.stderr + _our_log(quickstart)
    report = quickstart["report"].stdout
    if "SPECULATION_NOT_PAYING" in report:  # said while serving: beside the whole run's figure
        assert f"over the whole run: {value:.2f}x ({steps} steps)" in report
    assert "not measured" in report and "vs k in force (fit)" in report


def test_a_second_run_and_diff_as_written(quickstart):
    """The page's before-and-after: the same requests against k = 5 into a second store, and ``spectrace diff``
    of the two stores compares k 3 with k 5 per position, each side its own run."""
    assert quickstart["again"].returncode == 0, quickstart["again"].stderr[-2000:]
    # nothing lost to vLLM's shutdown: the store has every draft vLLM counted before the Ctrl-C
    stored = quickstart["again_stored"]
    assert stored.returncode == 0, stored.stderr
    assert quickstart["again_vllm_drafted"] > 0
    assert float(stored.stdout.split()[-1]) == quickstart["again_vllm_drafted"], stored.stdout
    ((line, done),) = quickstart["compare"]
    assert done.returncode == 0 and "Traceback" not in done.stderr, (line, done.stderr[-2000:])
    text = done.stdout
    heads = [l for l in text.splitlines() if l.startswith(("  A  run ", "  B  run "))]
    assert len(heads) == 2 and "dflash, k = 3" in heads[0] and "dflash, k = 5" in heads[1], text
    assert "spectrace-data-k5" in heads[1] and "spectrace-data-k5" not in heads[0], text
    table = text[text.index("Acceptance by draft position"):text.index("Mean acceptance length")]
    rows = {l.split()[0]: l.split()[1:] for l in table.splitlines() if re.match(r"^\d+ ", l)}
    assert sorted(rows) == ["0", "1", "2", "3", "4"], text  # B drafts 5 positions
    assert all(rows[p][0] != "—" and rows[p][3] != "—" for p in "012"), text  # both runs drafted 0-2
    assert all(rows[p][:3] == ["—"] * 3 and rows[p][3].isdigit() for p in "34"), text  # only B past 2
    assert "Mean acceptance length: A " in text, text


def test_the_store_and_the_report_keep_the_response_id_and_its_two_choices(quickstart):
    """An ``n=2`` completion: ``request_spec_decode`` has the response id the client got (not vLLM's
    ``cmpl-…-0``) once per choice, with the choice indexes the client got; the report lists both that way."""
    done = quickstart["choices"]
    assert done.returncode == 0, done.stderr[-2000:]
    response_id, *indexes = done.stdout.split()
    assert indexes == ["0", "1"] and response_id.startswith("cmpl-"), done.stdout
    export = next(line for line in _lines(blocks()["serve"]) if line.startswith("export "))
    rows = _run(f"{export}; spectrace query --format csv \"select external_request_id, choice_index, request_id "
                f"from request_spec_decode where external_request_id = '{response_id}' order by choice_index\"",
                quickstart["dir"], quickstart["env"])
    assert rows.returncode == 0, rows.stderr
    found = [line.split(",") for line in rows.stdout.splitlines()[1:] if line]
    assert [(r[0], r[1]) for r in found] == [(response_id, "0"), (response_id, "1")], rows.stdout + _our_log(quickstart)
    assert len({r[2] for r in found}) == 2  # two engine requests behind the one id
    attr = "json_extract_string(attributes, '$.\"spectrace.request.{}\"')".format
    sql = (f"select {attr('choice_index')} as choice, {attr('id')}, process_role from spans "
           f"where name = 'spectrace.request.output' and {attr('response_id')} = '{response_id}' order by choice")
    spans = _run(f"{export}; spectrace query --format csv {shlex.quote(sql)}", quickstart["dir"], quickstart["env"])
    assert spans.returncode == 0, spans.stderr
    # the frontend's span per choice: the client's id and index, and the engine request it was
    assert [line.split(",") for line in spans.stdout.splitlines()[1:] if line] == \
        [["0", found[0][2], "frontend"], ["1", found[1][2], "frontend"]], spans.stdout
    report = quickstart["report"].stdout
    listed = [line.split()[:2] for line in report.splitlines() if line.strip().startswith(response_id)]
    assert sorted(listed) == [[response_id, "0"], [response_id, "1"]], report


def test_metrics_page_series_carry_no_scope_labels_and_findings_are_named_by_kind(quickstart):
    """The server's /metrics: spectrace's series without OpenTelemetry's empty scope labels, help texts that stand
    alone, and each finding under the name of its kind (a runtime finding is not a configuration finding)."""
    from spectrace.sinks.metrics import RUNTIME_CODES

    page = quickstart["metrics"]
    ours = [line for line in page.splitlines() if line.startswith("spectrace_")]
    assert len(ours) > 20 and not any("otel_scope" in line for line in ours), page[:2000]
    helps = re.findall(r"^# HELP (spectrace_\S+) (.*)$", page, re.M)
    assert helps and not [h for h in helps if "README" in h[1]]
    for name, kind in (("spectrace_config_finding", False), ("spectrace_runtime_finding", True)):
        found = re.findall(rf'^{name}\{{[^}}]*code="(\w+)"', page, re.M)
        assert all((code in RUNTIME_CODES) == kind for code in found), (name, found)
