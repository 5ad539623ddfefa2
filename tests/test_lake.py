"""The lake sink, its views and its maintenance against a real PostgreSQL catalog (no vLLM).

Writers are pipelines built from the sink registry with the lake sink, as in a traced
process; readers are ``spectrace query --lake`` and ``spectrace.lake.read``.
"""

from __future__ import annotations

import json
import time

import pytest

import spectrace.store
from spectrace.cli import main
from spectrace.pipeline import Pipeline
from spectrace.sinks import build
from spectrace.lake import read as lake
from spectrace.settings import Settings

pytestmark = pytest.mark.server  # PostgreSQL

DAY_NS = 86_400 * 10**9


def writer_for(postgres, tmp_path, host: str, *, exporters: str = "lake", max_rows: int = 200_000,
               catalog: str | None = None) -> Pipeline:
    settings = Settings.from_env({
        "SPECTRACE_EXPORTER": exporters,
        "SPECTRACE_LAKE": catalog or postgres.catalog,
        "SPECTRACE_LAKE_DATA": str(tmp_path / "lake-data"),
        "SPECTRACE_HOST": host,
        "SPECTRACE_DIR": str(tmp_path / f"store-{host}"),
        "SPECTRACE_MAX_BUFFER_ROWS": str(max_rows),
    })
    writer, status = build(settings)  # as the runtime builds its pipeline
    assert status["lake"] == "lake"
    _HOSTS[id(writer)] = host
    return writer


def counts(writer: Pipeline, run_id: str, drafted: list[int], accepted: list[int], *, ts: int | None = None) -> None:
    n = len(drafted)
    writer.extend_columns("verify_counts", {
        "run_id": run_id, "host": _host(writer), "process_role": "engine_core", "ts": [ts or time.time_ns()] * n,
        "source": "engine_core", "position": list(range(n)), "context_bucket": "0-127",
        "drafted": drafted, "accepted": accepted,
    }, n)


_HOSTS: dict[int, str] = {}  # pipeline -> the host it was built for


def _host(writer: Pipeline) -> str:
    return _HOSTS[id(writer)]


def query(catalog: str, sql: str, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["query", sql, "--lake", catalog, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_two_hosts_one_lake_without_parquet(postgres, tmp_path, capsys):
    a, b = writer_for(postgres, tmp_path, "replica-a"), writer_for(postgres, tmp_path, "replica-b")
    for _ in range(3):
        counts(a, "run-a", [10, 10, 10], [9, 8, 7])
        counts(b, "run-b", [10, 10, 10], [1, 0, 0])
        a.flush()
        b.flush()
    a.append("runs", {"run_id": "run-a", "host": "replica-a", "started_at": time.time_ns(), "method": "draft_model"})
    a.close()
    b.close()

    rows = query(postgres.catalog, "select host, sum(drafted) as drafted, sum(accepted) as accepted "
                                   "from verify_counts group by host order by host", capsys)
    assert rows == [{"host": "replica-a", "drafted": 90, "accepted": 72},
                    {"host": "replica-b", "drafted": 90, "accepted": 3}]
    # the derived views work over the lake as over a store
    by_position = query(postgres.catalog, "select run_id, position, accepted from acceptance_by_position order by all", capsys)
    assert [(r["run_id"], r["position"], r["accepted"]) for r in by_position] == [
        ("run-a", 0, 27), ("run-a", 1, 24), ("run-a", 2, 21), ("run-b", 0, 3), ("run-b", 1, 0), ("run-b", 2, 0)]
    assert query(postgres.catalog, "select count(*) as n from findings", capsys) == [{"n": 0}]  # exists, empty
    # only the lake is configured: no segment anywhere
    assert not list(tmp_path.glob("store-*/**/*.parquet"))
    assert a.sink("lake").stats()["commits"] == 4 and a.dropped == 0


def test_a_catalog_in_uri_form_is_the_same_lake_and_its_password_is_never_printed(postgres, tmp_path, capsys, caplog):
    # trust authentication: the password is sent and ignored, so every command below really uses it
    uri = f"postgresql://{postgres.user}:pw9;sec%26ret@127.0.0.1:{postgres.port}/{postgres.database}?application_name=sp"
    writer = writer_for(postgres, tmp_path, "replica-a", catalog=uri)
    counts(writer, "run-a", [10, 10, 0], [9, 8, 0])  # position 2 drafted nothing: a NULL rate in the report
    writer.append("runs", {"run_id": "run-a", "host": "replica-a", "started_at": time.time_ns(), "method": "eagle3"})
    writer.close()
    assert writer.sink("lake").stats()["commits"] == 1
    assert query(uri, "select sum(drafted) as d from verify_counts", capsys) == [{"d": 20}]
    assert query(postgres.catalog, "select sum(drafted) as d from verify_counts", capsys) == [{"d": 20}]  # one lake
    assert main(["report", "--lake", uri]) == 0
    assert "position" in capsys.readouterr().out
    assert main(["lake", "maintain", "--catalog", f"ducklake:{uri}"]) == 0
    out = capsys.readouterr()
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert not any(secret in out.out + out.err + logged for secret in ("pw9;sec", "sec&ret", "sec%26ret"))


def test_lake_beside_the_store_gets_the_same_rows(postgres, tmp_path):
    writer = writer_for(postgres, tmp_path, "replica-a", exporters="duckdb,lake")
    for i in range(4):
        counts(writer, "run-a", [5, 5], [i, 1])
        writer.append("internal_errors", {"run_id": "run-a", "host": "replica-a", "ts": time.time_ns(), "hook": "h", "count": i})
        writer.flush()
    writer.close()
    sql = "select position, sum(drafted), sum(accepted) from verify_counts group by all order by all"
    store, fleet = spectrace.store.open(writer.sink("duckdb").root), lake.open(postgres.catalog)
    assert store.execute(sql).fetchall() == fleet.execute(sql).fetchall() == [(0, 20, 6), (1, 20, 4)]
    sql = "select host, hook, sum(count) from internal_errors group by all"
    assert store.execute(sql).fetchall() == fleet.execute(sql).fetchall() == [("replica-a", "h", 6)]
    fleet.close()


def test_a_lake_an_older_spectrace_created_gets_the_new_columns(postgres, tmp_path, capsys):
    """A lake whose step_shapes predates k_switches: the writer adds the column on connect (else every insert of
    the flush fails), rows written before read NULL there."""
    from spectrace import lake as catalog
    from spectrace.records import columns

    con = catalog.connect(postgres.catalog, data_path=str(tmp_path / "lake-data"))
    old = [c for c in columns("step_shapes") if c[0] != "k_switches"]
    con.execute(f"CREATE TABLE {catalog.ALIAS}.step_shapes ({', '.join(f'{n} {k}' for n, k in old)})")
    con.execute(f"INSERT INTO {catalog.ALIAS}.step_shapes (run_id, host, batch_band, k, steps) "
                "VALUES ('run-old', 'replica-a', '2', 1, 5)")
    con.close()
    writer = writer_for(postgres, tmp_path, "replica-a")
    writer.append("step_shapes", {"run_id": "run-new", "host": "replica-a", "ts": time.time_ns(), "batch_band": "3-4",
                                  "k": 4, "steps": 7, "k_switches": 6})
    counts(writer, "run-new", [1], [1])  # in the same transaction
    writer.flush()
    writer.close()
    assert writer.sink("lake").stats()["failures"] == 0
    rows = query(postgres.catalog, "select run_id, batch_band, k, steps, k_switches from step_shapes order by run_id", capsys)
    assert rows == [{"run_id": "run-new", "batch_band": "3-4", "k": 4, "steps": 7, "k_switches": 6},
                    {"run_id": "run-old", "batch_band": "2", "k": 1, "steps": 5, "k_switches": None}]
    assert query(postgres.catalog, "select sum(drafted) as d from verify_counts", capsys) == [{"d": 1}]


def test_catalog_down_keeps_rows_to_the_bound_then_drops_and_counts_then_resumes(postgres, tmp_path, caplog):
    writer = writer_for(postgres, tmp_path, "replica-a", max_rows=100)
    sink = writer.sink("lake")
    counts(writer, "run-a", [1] * 10, [1] * 10)
    writer.flush()
    assert sink.stats()["rows_written"] == 10

    postgres.stop()
    started = time.perf_counter()
    counts(writer, "run-a", [1] * 60, [1] * 60)
    writer.flush()  # fails: 60 rows kept
    counts(writer, "run-a", [1] * 60, [1] * 60)
    sink._retry_at = 0  # no back-off wait in a test
    writer.flush()  # fails again: 60 more would pass the bound of 100, dropped and counted
    down_s = time.perf_counter() - started
    assert (sink.pending_rows, sink.dropped, writer.dropped, writer.buffer_dropped) == (60, 60, 60, 0)
    assert sink.failures == 2
    assert down_s < 2.0, f"flushes against a stopped catalog took {down_s:.2f} s"
    assert len([r for r in caplog.records if "cannot write to the lake" in r.getMessage()]) == 1

    postgres.restart()
    counts(writer, "run-a", [1] * 5, [0] * 5)
    sink._retry_at = 0
    writer.flush()  # the 60 kept rows and the 5 new ones arrive
    writer.close()
    assert sink.pending_rows == 0 and sink.dropped == 60
    fleet = lake.open(postgres.catalog)
    assert fleet.execute("select count(*), sum(accepted) from verify_counts").fetchone() == (75, 70)
    fleet.close()


def test_maintain_merges_files_keeps_answers_and_applies_retention(postgres, tmp_path, capsys):
    writer = writer_for(postgres, tmp_path, "replica-a")
    old = time.time_ns() - 40 * DAY_NS
    for i in range(12):  # 12 flushes of 30 rows: one data file each (more rows than DuckLake inlines)
        counts(writer, "run-new", [2] * 30, [1] * 30)
        counts(writer, "run-old", [2] * 30, [2] * 30, ts=old)
        writer.flush()
    writer.close()
    data = tmp_path / "lake-data"
    sql = "select run_id, host, sum(drafted) as drafted, sum(accepted) as accepted from verify_counts group by all order by all"
    before, files_before = query(postgres.catalog, sql, capsys), lake.data_files(data)
    assert files_before >= 12

    assert main(["lake", "maintain", "--catalog", postgres.catalog, "--keep-snapshots", "0s"]) == 0
    out = capsys.readouterr().out
    assert "merge" in out and "delete files" in out
    assert query(postgres.catalog, sql, capsys) == before
    files_after = lake.data_files(data)
    assert files_after < files_before, (files_before, files_after)

    assert main(["lake", "maintain", "--catalog", postgres.catalog, "--keep-snapshots", "0s", "--retention", "30d"]) == 0
    assert "removed 1 run(s)" in capsys.readouterr().out
    assert query(postgres.catalog, sql, capsys) == [r for r in before if r["run_id"] == "run-new"]


def test_lake_cli_errors_are_one_line(postgres, capsys, monkeypatch):
    monkeypatch.delenv("SPECTRACE_LAKE", raising=False)
    assert main(["query", "select 1", "--lake"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    down = f"postgres:dbname=spectrace host=127.0.0.1 port={postgres.port} user=nobody_here"
    assert main(["report", "--lake", down]) == 2
    assert capsys.readouterr().err.startswith("spectrace: error: cannot attach the lake")
    assert main(["lake", "maintain"]) == 2
    assert "SPECTRACE_LAKE" in capsys.readouterr().err
    monkeypatch.setenv("SPECTRACE_LAKE", postgres.catalog)  # the default catalog; an empty lake
    assert main(["query", "--lake", "select 1"]) == 2
    assert "does not exist yet" in capsys.readouterr().err
