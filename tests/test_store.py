"""The segment store and `spectrace query`, without vLLM (pure I/O and SQL)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spectrace.store
from spectrace.cli import main
from spectrace.testing import store_pipeline
from spectrace.records import TABLES


def _writer(root, **settings):
    return store_pipeline(root, retention_s=0, compact_interval_s=0, **settings)


def test_rows_round_trip_through_segments(tmp_path):
    writer = _writer(tmp_path)
    writer.append("runs", {"run_id": "r1", "process_role": "frontend", "pid": 7, "started_at": 1_700_000_000_000_000_000,
                           "method": "dflash", "num_speculative_tokens": 5})
    assert writer.flush() == 1
    con = spectrace.store.open(tmp_path)
    row = con.execute("select run_id, method, num_speculative_tokens, schema_version, started_at from runs").fetchone()
    assert row[:4] == ("r1", "dflash", 5, 1)
    assert str(row[4]).startswith("2023-11-14")


def test_every_documented_view_exists_and_is_empty_when_unrecorded(tmp_path):
    writer = _writer(tmp_path)
    writer.append("runs", {"run_id": "r1"})
    writer.flush()
    con = spectrace.store.open(tmp_path)
    for view in spectrace.store.view_names():
        assert con.execute(f"select count(*) from {view}").fetchone()[0] == (1 if view == "runs" else 0), view
    types = dict(con.execute("select column_name, data_type from information_schema.columns where table_name = 'spans'").fetchall())
    assert types["attributes"] == "JSON" and types["start_time"] == "TIMESTAMP_NS"


@pytest.mark.parametrize("name", ["store*", "store?", "store[1]"])
def test_a_store_whose_path_holds_glob_characters_reads_its_own_files_only(tmp_path, name):
    writer = _writer(tmp_path / name)
    writer.append("runs", {"run_id": "mine"})
    writer.flush()
    # copies under the names the path matches as a glob (DuckDB globs each path it is given), same file names
    for neighbour in ["storeX", "store1"]:
        shutil.copytree(tmp_path / name, tmp_path / neighbour)
        for path in (tmp_path / neighbour).rglob("*.parquet"):
            table = pq.read_table(path)
            pq.write_table(table.set_column(table.schema.get_field_index("run_id"), "run_id", pa.array(["copy"])), path)
    con = spectrace.store.open(tmp_path / name)
    assert con.execute("select run_id from runs").fetchall() == [("mine",)]


def test_older_segments_without_new_columns_are_read(tmp_path):
    folder = tmp_path / "findings" / "run=old"
    folder.mkdir(parents=True)
    # a version-0 segment that predates the caused_by and fix columns
    pq.write_table(pa.table({"run_id": ["old"], "code": ["SWA_DROPPED"], "severity": ["error"], "schema_version": [0]}),
                   folder / "old.parquet")
    writer = _writer(tmp_path)
    writer.append("findings", {"run_id": "new", "code": "TAP_MISMATCH", "severity": "error", "caused_by": None, "fix": "x"})
    writer.flush()
    con = spectrace.store.open(tmp_path)
    rows = con.execute("select run_id, code, fix, schema_version from findings order by run_id").fetchall()
    assert rows == [("new", "TAP_MISMATCH", "x", 1), ("old", "SWA_DROPPED", None, 0)]


def test_full_buffer_drops_and_counts_instead_of_blocking(tmp_path):
    writer = _writer(tmp_path, max_buffer_rows=10)
    for i in range(25):
        writer.append("verify_counts", {"run_id": "r", "position": i})
    assert writer.dropped == writer.buffer_dropped == 15
    assert writer.flush() == 10


def test_unwritable_directory_is_one_error_and_no_partial_file(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    writer = _writer(blocker / "store")
    writer.append("runs", {"run_id": "r"})
    writer.append("runs", {"run_id": "r"})
    assert writer.flush() == 2  # handed to the store sink, which could not write them
    assert writer.sink("duckdb").stats()["segments_written"] == 0
    writer.append("runs", {"run_id": "r"})
    writer.flush()
    assert writer.sink("duckdb").write_errors == 2 and writer.dropped == 3 and writer.buffer_dropped == 0
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1


_WRITER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from spectrace.testing import store_pipeline
    w = store_pipeline(sys.argv[1], host="writer", flush_interval_s=0.02, retention_s=0, compact_interval_s=0)
    w.start()
    deadline = time.time() + float(sys.argv[2])
    i = 0
    while time.time() < deadline:
        w.extend("verify_counts", [{"run_id": "live", "source": "engine_core", "position": p, "drafted": 1, "accepted": 1}
                                   for p in range(50)])
        i += 1
        time.sleep(0.005)
    w.close()
    print(i * 50)
    """
)


def test_query_reads_while_another_process_writes(tmp_path, capsys):
    writer = subprocess.Popen([sys.executable, "-c", _WRITER_SCRIPT, str(tmp_path), "4"], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 20
        while not list(tmp_path.glob("verify_counts/*/*.parquet")) and time.time() < deadline:
            time.sleep(0.05)
        seen = []
        while writer.poll() is None:
            assert main(["query", "select sum(drafted) from verify_counts", "--dir", str(tmp_path), "--format", "json"]) == 0
            seen.append(json.loads(capsys.readouterr().out)[0]["sum(drafted)"])
        total = int(writer.stdout.read().strip())
    finally:
        writer.kill()
    assert len(seen) >= 3 and seen == sorted(seen)  # reads succeed and only grow
    assert main(["query", "select sum(drafted) as n from verify_counts", "--dir", str(tmp_path), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", str(total)]
    assert not list(tmp_path.glob("**/*.tmp"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["query", "select nonsense from", "--dir", "{store}"], "query failed"),
        (["query", "select 1", "--dir", "{missing}"], "no spectrace store"),
        (["query", "select 1", "--dir", "{empty}"], "holds no records"),
        (["query", "--named", "no_such_query", "--dir", "{store}"], "no named query"),
        (["query", "--dir", "{store}"], "give SQL"),
        (["report", "--dir", "{store}", "--run", "nope"], "no run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    store = tmp_path / "store"
    writer = _writer(store)
    writer.append("runs", {"run_id": "r1"})
    writer.flush()
    (tmp_path / "empty").mkdir()
    paths = {"store": store, "missing": tmp_path / "missing", "empty": tmp_path / "empty"}
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_table_format_prints_columns_and_count(tmp_path, capsys):
    writer = _writer(tmp_path)
    writer.extend("runs", [{"run_id": "a", "method": "eagle3"}, {"run_id": "b", "method": "dflash"}])
    writer.flush()
    assert main(["query", "select run_id, method from runs order by run_id", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run_id", "method"]
    assert lines[2].split() == ["a", "eagle3"] and lines[-1] == "(2 rows)"


def test_all_tables_have_common_columns():
    from spectrace.records import columns

    for table in TABLES:
        names = [c[0] for c in columns(table)]
        assert {"run_id", "process_role", "pid", "host", "rank", "schema_version"} <= set(names), table
        assert len(names) == len(set(names)), table


def test_bad_setting_is_one_line_and_the_default(monkeypatch, caplog):
    """In a vLLM process an unparsable value is one log line (variable, value, default used) and the default."""
    import logging

    from spectrace.settings import Settings, SettingsError

    monkeypatch.setenv("SPECTRACE_FLUSH_INTERVAL", "soon")
    with pytest.raises(SettingsError, match="SPECTRACE_FLUSH_INTERVAL='soon' is not a duration"):
        Settings.from_env(strict=True)
    with caplog.at_level(logging.WARNING, logger="vllm.spectrace"):
        assert Settings.from_env().flush_interval_s == Settings.flush_interval_s
    assert [r.getMessage() for r in caplog.records] == [
        "spectrace: SPECTRACE_FLUSH_INTERVAL='soon' is not a duration (e.g. 90s, 15m, 12h, 7d, 2w; a bare number "
        "is seconds; > 0 s and at most 1d); using 2s"
    ]


