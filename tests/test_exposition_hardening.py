"""The exposition directory and files against another user's plants (issue 23): real
ProcessFile, FileCollector and ExpositionSink, real prometheus_client; no vLLM."""

from __future__ import annotations

import logging
import os
import pwd
import stat
import threading
import time
from pathlib import Path

import pytest

from spectrace.sinks import exposition

NOBODY = pwd.getpwnam("nobody").pw_uid
START = exposition._start_time(os.getpid())
GOOD = f"spectrace_good_total{{pid=\"{os.getpid()}\"}} 7.0\n"


@pytest.fixture
def fresh_dir(monkeypatch):
    """server_dir resolves anew, and the variable it sets is undone after the test."""
    monkeypatch.setattr(exposition, "_dir", None)
    # set, then deleted: monkeypatch records the variable's absence and restores it (delenv alone, the variable
    # absent, records nothing: server_dir's value leaked into the xdist worker and every later engine it started)
    monkeypatch.setenv(exposition.DIR_ENV, "")
    monkeypatch.delenv(exposition.DIR_ENV)


def _good(directory: Path) -> Path:
    path = directory / f"{os.getpid()}.{START}.prom"
    path.write_text("# TYPE spectrace_good counter\n" + GOOD)
    return path


def _series(collector) -> dict[str, float]:
    return {s.name: s.value for family in collector.collect() for s in family.samples}


def _live_child_name() -> str:
    # a live process other than this one, with its real start time
    return f"{os.getppid()}.{exposition._start_time(os.getppid())}.prom"


def test_configured_dir_is_created_0700(tmp_path, fresh_dir):
    old = os.umask(0o022)
    try:
        path = exposition.server_dir(tmp_path / "a" / "metrics")
    finally:
        os.umask(old)
    assert path == tmp_path / "a" / "metrics"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_own_wide_dir_is_narrowed_with_one_line(tmp_path, fresh_dir, caplog):
    wide = tmp_path / "wide"
    wide.mkdir()
    os.chmod(wide, 0o777)
    with caplog.at_level(logging.WARNING, logger="vllm.spectrace"):
        assert exposition.server_dir(wide) == wide
    assert stat.S_IMODE(os.stat(wide).st_mode) == 0o700
    assert [r.message for r in caplog.records] == [f"spectrace: {exposition.DIR_ENV}={wide} was mode 0777; made 0700"]


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_dir_of_another_user_is_refused(tmp_path, fresh_dir, caplog, mode):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, NOBODY, -1)
    os.chmod(foreign, mode)
    with caplog.at_level(logging.WARNING, logger="vllm.spectrace"):
        path = exposition.server_dir(foreign)
    assert path != foreign and path.name.startswith(exposition._DIR_PREFIX)
    assert os.stat(path).st_uid == os.getuid() and stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert os.environ[exposition.DIR_ENV] == str(path)  # the processes vLLM starts use the private one too
    assert len(caplog.records) == 1 and "refused" in caplog.records[0].message
    assert stat.S_IMODE(os.stat(foreign).st_mode) == mode  # left as it was


def test_sink_writes_0600_file_without_following_planted_symlinks(tmp_path, fresh_dir):
    from opentelemetry.sdk.metrics import MeterProvider

    directory = tmp_path / "metrics"
    sink = exposition.ExpositionSink(directory)
    provider = MeterProvider(metric_readers=[sink.metric_reader()])
    path = sink.file.path
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    # the old predictable temporary name, and the file's own name, both planted as symlinks
    (directory / f".{path.name}.tmp").symlink_to(secret)
    path.symlink_to(secret)
    provider.get_meter("t").create_counter("spectrace_written").add(3)
    sink.export(None)
    assert secret.read_text() == "root only\n"
    info = os.lstat(path)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert "spectrace_written_total" in path.read_text()
    assert [n for n in os.listdir(directory) if n.endswith(".tmp") and not os.path.islink(directory / n)] == []
    assert _series(exposition.FileCollector(directory))["spectrace_written_total"] == 3.0
    sink.close()
    provider.shutdown()


def test_names_without_a_start_time_are_skipped_and_counted(tmp_path):
    _good(tmp_path)
    for name in (f"{os.getpid()}.prom", f"{os.getpid()}.0.prom", "1.prom", "1.0.prom"):
        (tmp_path / name).write_text("vllm:num_requests_running 1e9\nspectrace_planted 1\n")
    collector = exposition.FileCollector(tmp_path)
    assert _series(collector) == {"spectrace_good_total": 7.0}
    assert collector.skipped == {"name without a pid and its start time": 4}


def test_symlink_fifo_directory_foreign_and_oversized_are_skipped(tmp_path, caplog):
    _good(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("spectrace_secret 1\n")
    os.chmod(secret, 0o600)
    child = exposition._start_time(os.getppid())
    names = {f"{os.getppid()}.{child}.prom": "symlink"}
    (tmp_path / f"{os.getppid()}.{child}.prom").symlink_to(secret)
    # the FIFO takes pid 1's name (a live process with its real start time)
    init = exposition._start_time(1)
    os.mkfifo(tmp_path / f"1.{init}.prom")
    names[f"1.{init}.prom"] = "not a regular file"
    collector = exposition.FileCollector(tmp_path)
    result: dict = {}
    with caplog.at_level(logging.WARNING, logger="vllm.spectrace"):
        scrape = threading.Thread(target=lambda: result.update(_series(collector)), daemon=True)
        scrape.start()
        scrape.join(5)
        assert not scrape.is_alive(), "a FIFO blocked the scrape"
        assert result == {"spectrace_good_total": 7.0}
        assert collector.skipped == {"symlink": 1, "not a regular file": 1}
        assert secret.read_text() == "spectrace_secret 1\n"
        # a second scrape counts again but logs nothing new
        _series(collector)
    assert collector.skipped == {"symlink": 2, "not a regular file": 2}
    assert len(caplog.records) == 2


def test_directory_foreign_file_oversized_and_malformed_never_empty_the_others(tmp_path, monkeypatch):
    # each plant takes the name of a live process (pid 1 and our parent) in turn
    monkeypatch.setattr(exposition, "MAX_FILE_BYTES", 1000)
    plants = {
        "a directory named *.prom": lambda p: p.mkdir(),
        "owned by another user": lambda p: (p.write_text("spectrace_foreign 1\n"), os.chown(p, NOBODY, -1)),
        "over the size cap": lambda p: p.write_text("spectrace_big 1\n" * 100),
        "malformed": lambda p: p.write_text("spectrace_bad{unclosed 1\n"),
        "not utf-8": lambda p: p.write_bytes(b"\xff\xfe spectrace 1\n"),
    }
    expected = {
        "a directory named *.prom": "not a regular file",
        "owned by another user": "owned by another user",
        "over the size cap": "over the size cap",
        "malformed": "malformed",
        "not utf-8": "malformed",
    }
    for what, plant in plants.items():
        directory = tmp_path / what.replace(" ", "-").replace("*", "x")
        directory.mkdir()
        _good(directory)
        plant(directory / _live_child_name())
        collector = exposition.FileCollector(directory)
        assert _series(collector) == {"spectrace_good_total": 7.0}, what
        assert collector.skipped == {expected[what]: 1}, what


def test_vllm_series_in_a_file_are_not_reexposed(tmp_path):
    (tmp_path / f"{os.getpid()}.{START}.prom").write_text(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1e9\n# TYPE spectrace_good counter\n" + GOOD
    )
    assert _series(exposition.FileCollector(tmp_path)) == {"spectrace_good_total": 7.0}


def test_dead_process_file_is_removed(tmp_path):
    # a pid that is alive but with another start time: its file is stale
    stale = tmp_path / f"{os.getpid()}.{int(START) + 1}.prom"
    stale.write_text("spectrace_stale 1\n")
    _good(tmp_path)
    collector = exposition.FileCollector(tmp_path)
    assert _series(collector) == {"spectrace_good_total": 7.0}
    assert not stale.exists() and collector.skipped == {}


def test_a_collector_per_scrape_logs_a_bad_file_once(tmp_path, caplog):
    # vLLM's multiprocess mode builds a registry, so a collector, per scrape
    _good(tmp_path)
    (tmp_path / "1.0.prom").write_text("spectrace_planted 1\n")
    with caplog.at_level(logging.WARNING, logger="vllm.spectrace"):
        for _ in range(3):
            assert _series(exposition.FileCollector(tmp_path)) == {"spectrace_good_total": 7.0}
    assert len(caplog.records) == 1
    assert exposition.FileCollector(tmp_path).skipped == {"name without a pid and its start time": 3}


def test_periodic_flushes_rewrite_the_file_at_most_every_interval(tmp_path, fresh_dir, monkeypatch):
    """SPECTRACE_EXPOSITION_INTERVAL: a periodic flush rewrites the file at most every interval; a flush with nothing
    new after a skipped one catches it up; a flush asked for always rewrites it."""
    from types import SimpleNamespace

    from opentelemetry.sdk.metrics import MeterProvider

    clock = [100.0]
    monkeypatch.setattr(exposition, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    directory = tmp_path / "metrics"
    sink = exposition.ExpositionSink(directory, interval_s=5.0)
    provider = MeterProvider(metric_readers=[sink.metric_reader()])
    counter = provider.get_meter("t").create_counter("spectrace_written")

    def flush(at: float, rows: int, periodic: bool = True) -> float:
        clock[0] = at
        counter.add(1)
        sink.export(SimpleNamespace(periodic=periodic, rows=rows))
        return _series(exposition.FileCollector(directory))["spectrace_written_total"]

    assert flush(100, 5) == 1  # the first periodic flush writes
    assert flush(102, 5) == 1 and flush(104, 5) == 1  # within the interval: the file stays as it was
    assert flush(105.5, 5) == 4  # the interval passed
    assert flush(106, 5) == 4
    assert flush(107, 0) == 6  # nothing new after a skipped flush: caught up at once
    assert flush(108, 0) == 6  # nothing new and nothing behind: left
    assert flush(108.5, 3, periodic=False) == 8  # asked for (rt.flush(), the last flush): always
    assert sink.stats() == {"written": 4, "skipped": 4}
    sink.close()
    provider.shutdown()


def test_only_the_flush_threads_batches_are_periodic(tmp_path):
    from spectrace.pipeline import Pipeline, Sink

    seen = []

    class Recording(Sink):
        def export(self, batch) -> None:
            seen.append(batch.periodic)

    pipeline = Pipeline(flush_interval_s=0.05, max_buffer_rows=100)
    pipeline.add_sink(Recording())
    pipeline.flush()
    pipeline.start()
    deadline = time.monotonic() + 10
    while True not in seen and time.monotonic() < deadline:
        time.sleep(0.02)
    pipeline.close()  # the last flush
    assert seen[0] is False and True in seen and seen[-1] is False
