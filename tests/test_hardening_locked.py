"""``spectrace query --locked``: every statement DuckDB can run is refused in one line (exit 2) and
writes nothing unless it only reads the store, nested writes included; the connection under it
cannot write a file or read one outside the store even when handed a statement directly (no vLLM:
the real store pipeline, reader and CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import duckdb
import pytest

import spectrace.store
from spectrace.cli import main
from spectrace.queries import named
from spectrace.testing import store_pipeline


def _fill(writer, drafted: int = 4):
    writer.append("runs", {"run_id": "good", "method": "eagle3", "started_at": time.time_ns()})
    writer.extend("verify_counts", [{"run_id": "good", "source": "engine_core", "position": 0, "drafted": drafted,
                                     "accepted": 2, "ts": time.time_ns()}])
    writer.flush()


def _tree(root):
    """Every path under ``root`` with its size and mtime: what a refused statement must leave as it was."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    writer = store_pipeline(root, retention_s=0, compact_interval_s=60)
    _fill(writer)
    (tmp_path / "secret.csv").write_text("password\nhunter2\n")
    return root, writer


def _hostile(root, tmp_path) -> dict[str, str]:
    """SQL that writes, changes a setting or reads outside the store, each with what its one line says."""
    seg = next((root / "verify_counts" / "run=good").glob("*.parquet"))
    into = f"{root}/verify_counts/run=good/x-1-9-000001.parquet"  # a segment's name: it would read as data
    secret = tmp_path / "secret.csv"
    only = "only SELECT statements, not"
    reads = "only SELECT statements that read, not the table function"
    return {
        # writes, at the top and nested
        f"explain analyze copy (select 'good' as run_id, 10**9 as drafted) to '{into}'": f"{only} EXPLAIN COPY",
        f"explain (analyze, format json) copy runs to '{root}/x.csv'": f"{only} EXPLAIN COPY",
        f"copy (with forged as (select 'good' as run_id, 10**9 as drafted) select * from forged) to '{into}'": f"{only} COPY",
        f"copy (select * from (select 'good' as run_id, 10**9 as drafted) s where drafted in (select 1)) to '{into}'":
            f"{only} COPY",
        f"copy (select * from '{seg}') to '{seg}' (overwrite true)": f"{only} COPY",
        f"export database '{root}/exported'": f"{only} EXPORT",
        "create table forged as select 'good' as run_id, 10**9 as drafted": f"{only} CREATE",
        "create or replace view verify_counts as select 'good' as run_id, 10**9 as drafted": f"{only} CREATE",
        "insert into runs select * from runs": f"{only} INSERT",
        "update runs set method = 'x'": f"{only} UPDATE",
        "delete from runs": f"{only} DELETE",
        "drop view runs": f"{only} DROP",
        "select 1; drop view runs": f"{only} DROP",
        "create macro m() as 1": f"{only} CREATE",
        f"attach '{root}/new.duckdb' as w": f"{only} ATTACH",
        "detach memory": f"{only} DETACH",
        "install httpfs": f"{only} LOAD",  # DuckDB's parser names INSTALL a LOAD statement
        "load httpfs": f"{only} LOAD",
        "set enable_external_access = true": f"{only} SET",
        "set variable spectrace_files_runs = ['/etc/passwd']": f"{only} SET",
        "reset lock_configuration": f"{only} SET",
        "pragma enable_profiling": f"{only} PRAGMA",
        "call checkpoint()": f"{only} CALL",
        "checkpoint": f"{only} CALL",
        "prepare p as select 1": f"{only} PREPARE",
        "vacuum": f"{only} VACUUM",
        "use memory": f"{only} SET",
        "pivot runs on method using count(*)": f"{only} CREATE",  # a PIVOT without IN creates a type first
        # a SELECT that writes or runs unchecked SQL: every table function that is not a read is refused
        f"select * from enable_logging(storage='file', storage_path='{root}/log')": f"{reads} enable_logging()",
        f"with c as (select * from runs where exists (select * from enable_logging(storage='file', storage_path='{root}/l')))"
        " select * from c": f"{reads} enable_logging()",
        f"select * from runs, lateral (select * from enable_profiling(save_location='{root}/p.json'))":
            f"{reads} enable_profiling()",
        "select * from checkpoint()": f"{reads} checkpoint()",
        f"select * from query('select * from read_csv(''{secret}'')')": f"{reads} query()",
        "select * from query_table('runs')": f"{reads} query_table()",
        "select * from json_execute_serialized_sql(json_serialize_sql('select 1'))": f"{reads} json_execute_serialized_sql()",
        f"explain analyze select * from enable_logging(storage='file', storage_path='{root}/log')": f"{reads} enable_logging()",
        # reading outside the store: refused by the connection itself
        f"select * from read_csv('{secret}')": "disabled by configuration",
        f"select * from '{secret}'": "disabled by configuration",
        f"select * from read_text('{root}/../secret.csv')": "disabled by configuration",
        f"select * from read_parquet('{root}/verify_counts/*/*.parquet')": "disabled by configuration",  # a glob, not a file
        f"select * from glob('{tmp_path}/*')": "disabled by configuration",
        "select * from read_text('/etc/passwd')": "disabled by configuration",
    }


def test_every_write_setting_and_outside_read_is_refused_in_one_line_and_writes_nothing(store, tmp_path, capsys):
    root, _ = store
    before = _tree(tmp_path)
    for sql, said in _hostile(root, tmp_path).items():
        assert main(["query", "--locked", "--dir", str(root), sql]) == 2, sql
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and err.startswith("spectrace: error: ") and said in err, (sql, err)
        assert "hunter2" not in err + out and "Traceback" not in err, (sql, err)
    assert _tree(tmp_path) == before  # nothing written, nothing changed, not even a log or profile file
    assert main(["query", "--locked", "--dir", str(root), "select sum(drafted) from verify_counts"]) == 0
    assert "4" in capsys.readouterr().out


def test_the_connection_itself_writes_no_file_and_reads_only_the_stores_segments(store, tmp_path):
    """Handed straight to the locked DuckDB connection (past the statement check), a write fails too."""
    root, _ = store
    con = spectrace.store.open(root, locked=True)
    raw = con._con
    seg = next((root / "verify_counts" / "run=good").glob("*.parquet"))
    before = _tree(tmp_path)
    for sql in (
        f"copy (select 'good' as run_id, 10**9 as drafted) to '{root}/verify_counts/run=good/x-1-9-000001.parquet'",
        f"copy (select * from '{seg}') to '{seg}' (overwrite true)",  # over a segment it may read
        f"copy runs to '{root}/runs/x.csv'",
        f"export database '{root}/exported'",
        f"attach '{root}/new.duckdb' as w",
        f"select * from read_csv('{tmp_path}/secret.csv')",
        "set allowed_paths = ['/etc/passwd']",
        "set enable_external_access = true",
        "install httpfs",
    ):
        with pytest.raises(duckdb.Error) as info:
            raw.execute(sql)
        assert "disabled by configuration" in str(info.value) or "configuration has been locked" in str(info.value), (
            sql, info.value)
    assert _tree(tmp_path) == before
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 4


def test_reads_still_answer_and_a_segment_written_later_is_read(store, capsys):
    root, writer = store
    for name in named.names():  # every named query runs locked
        assert main(["query", "--locked", "--dir", str(root), "--named", name]) == 0, name
        assert "Traceback" not in capsys.readouterr().err
    reads = [
        "select sum(drafted) from verify_counts",
        "with t as (select * from verify_counts) select count(*) from t, range(2)",
        "explain analyze select count(*) from runs",
        "describe runs",
        "summarize verify_counts",
        "select * from duckdb_views() where view_name = 'runs'",
        f"select count(*) from read_parquet({[str(p) for p in (root / 'runs').rglob('*.parquet')]!r})",  # a store file
    ]
    for sql in reads:
        assert main(["query", "--locked", "--dir", str(root), sql]) == 0, sql
        assert capsys.readouterr().err == ""
    con = spectrace.store.open(root, locked=True)
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 4
    cursor = con.cursor()
    _fill(writer, drafted=6)  # a new segment: the connection's allowed files are locked, so it is locked anew
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 10
    assert cursor.execute("select sum(drafted) from verify_counts").fetchone()[0] == 10
    assert con.execute("select count(*) from runs").fetchone()[0] == 2
    with pytest.raises(spectrace.store.StoreError):
        con.execute(f"copy runs to '{root}/x.csv'")
    con.close()


def test_a_store_whose_path_has_glob_characters_reads_locked(tmp_path):
    root = tmp_path / "st*re [1]?"  # DuckDB checks access on the glob-literal name the views give it
    _fill(store_pipeline(root, retention_s=0, compact_interval_s=60))
    con = spectrace.store.open(root, locked=True)
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 4
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        con._con.execute(f"copy runs to '{root}/runs/x.csv'")
    assert not (root / "runs" / "x.csv").exists()


def test_a_refusal_is_the_only_line_even_beside_a_skipped_file(store):
    """As a user runs it: the write that once aborted the process at exit is one line, exit 2, checked before
    the store is opened (no warning about the store comes with it); a read names the skipped file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, _ = store
    planted = root / "verify_counts" / "run=good" / "evil-1-1-000001.parquet"
    pq.write_table(pa.table({"run_id": ["good"], "drafted": ["ten"]}), planted)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    run = [sys.executable, "-m", "spectrace.cli", "query", "--locked", "--dir", str(root)]
    refused = subprocess.run([*run, f"select * from enable_logging(storage='file', storage_path='{root}/log')"],
                             capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and refused.stderr == (
        "spectrace: error: a locked store runs only SELECT statements that read, not the table function enable_logging()\n")
    read = subprocess.run([*run, "select sum(drafted) from verify_counts"], capture_output=True, text=True, timeout=60, env=env)
    assert read.returncode == 0 and f"skipping {planted}" in read.stderr and "4" in read.stdout
    assert not (root / "log").exists()
