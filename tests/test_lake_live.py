"""The fleet lake with real vLLM: two replicas (two processes, two host names) write one lake.

PostgreSQL is real (``spectrace.testing.postgres``), the engines are real vLLM on CPU
in child processes (``SPECTRACE_EXPORTER=lake`` only: no Parquet segment is written).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spectrace import lake as lake_connection
from spectrace.cli import main
from spectrace.lake import read as lake
from spectrace.testing.engine import K, EngineSpec, run_engines

pytestmark = [pytest.mark.vllm, pytest.mark.server]  # PostgreSQL

HOSTS = {"replica-a": "self", "replica-b": "seeded"}  # host -> engine (drafter) it serves


def spec(zoo, name: str, drafter: str, **kwargs) -> EngineSpec:
    return EngineSpec(name=name, target=zoo["target"],
                      speculative={"method": "draft_model", "model": zoo[f"draft_{drafter}"], "num_speculative_tokens": K},
                      **kwargs)


def lake_env(postgres, data: Path, host: str, **extra: str) -> dict[str, str]:
    return {"SPECTRACE_EXPORTER": "lake", "SPECTRACE_LAKE": postgres.catalog, "SPECTRACE_LAKE_DATA": str(data),
            "SPECTRACE_HOST": host, "SPECTRACE_FLUSH_INTERVAL": "0.5", **extra}


def query(catalog: str, sql: str, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["query", sql, "--lake", catalog, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def untraced(zoo, scratch, cache_root):
    return run_engines([spec(zoo, "self", "self"), spec(zoo, "seeded", "seeded")], store=None, traced=False,
                       cache_root=cache_root, scratch=scratch)


@pytest.fixture
def fleet(zoo, scratch, cache_root, postgres, tmp_path):
    """Both replicas at once, each in its own process, into one lake."""
    data = tmp_path / "lake-data"
    # Every flush writes data files (DuckLake otherwise inlines inserts of up to 10 rows in the
    # catalog): the many small files that `spectrace lake maintain` exists to merge.
    con = lake_connection.connect(postgres.catalog, data_path=str(data))
    con.execute("SELECT * FROM ducklake_set_option('lake', 'data_inlining_row_limit', 0)").fetchall()
    con.close()

    def replica(host: str):
        engine = HOSTS[host]
        return run_engines([spec(zoo, engine, engine, repeat=3)], store=tmp_path / f"store-{host}", scratch=scratch,
                           cache_root=cache_root, env=lake_env(postgres, data, host),
                           log_file=scratch / f"lake-{host}.log")[engine]

    with ThreadPoolExecutor(len(HOSTS)) as pool:
        results = dict(zip(HOSTS, pool.map(replica, HOSTS)))
    for host, result in results.items():
        assert result.ok, f"{host}: {result.error}"
    return postgres, data, results


def test_fleet_acceptance_per_host_equals_each_engines_vllm_counters(fleet, untraced, tmp_path, capsys):
    postgres, data, results = fleet
    rows = query(postgres.catalog, "select host, position, sum(drafted) as drafted, sum(accepted) as accepted "
                                   "from verify_counts where source = 'engine_core' group by all order by all", capsys)
    for host, result in results.items():
        mine = [r for r in rows if r["host"] == host]
        assert [r["accepted"] for r in mine] == result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
        assert sum(r["drafted"] for r in mine) == result.metrics["vllm:spec_decode_num_draft_tokens"]
        assert result.tokens == untraced[HOSTS[host]].tokens  # tracing changed nothing
        assert result.exporter["dropped"] == 0 and result.exporter["lake"]["failures"] == 0
    total = query(postgres.catalog, "select sum(drafted) as drafted, sum(accepted) as accepted "
                                    "from verify_counts where source = 'engine_core'", capsys)
    assert total == [{
        "drafted": sum(r.metrics["vllm:spec_decode_num_draft_tokens"] for r in results.values()),
        "accepted": sum(r.metrics["vllm:spec_decode_num_accepted_tokens"] for r in results.values()),
    }]
    # the store's views over the fleet: one run per replica, told apart by host
    runs = query(postgres.catalog, "select r.host, r.run_id, r.method, sum(p.accepted) as accepted from runs r "
                                   "join acceptance_by_position p using (run_id) group by all order by all", capsys)
    assert [(r["host"], r["run_id"], r["method"], r["accepted"]) for r in runs] == [
        (host, result.run_id, "draft_model", result.metrics["vllm:spec_decode_num_accepted_tokens"])
        for host, result in sorted(results.items())
    ]
    for table in ("spans", "hooks", "model_configs", "attention_layout", "verify_steps"):
        hosts = {r["host"] for r in query(postgres.catalog, f"select distinct host from {table}", capsys)}
        assert hosts == set(HOSTS), table
    assert main(["report", "--lake", postgres.catalog, "--run", results["replica-b"].run_id]) == 0
    assert results["replica-b"].run_id in capsys.readouterr().out
    # the lake alone is configured: neither replica wrote a segment
    assert not list(tmp_path.glob("store-*/**/*.parquet"))

    # maintenance: the same answers from fewer data files
    answers = ["select host, position, sum(drafted), sum(accepted) from verify_counts group by all order by all",
               "select host, count(*) from verify_steps group by all order by all",
               "select run_id, position, drafted, accepted, rate from acceptance_by_position"]
    before = [query(postgres.catalog, sql, capsys) for sql in answers]
    files_before = lake.data_files(data)
    assert main(["lake", "maintain", "--catalog", postgres.catalog, "--keep-snapshots", "0s"]) == 0
    files_after = lake.data_files(data)
    assert [query(postgres.catalog, sql, capsys) for sql in answers] == before
    assert files_after < files_before, (files_before, files_after)
    with capsys.disabled():  # measured, for the record (pytest -s)
        print(f"\nlake: data files {files_before} -> {files_after};",
              {host: r.exporter["lake"] for host, r in results.items()})


def test_catalog_stopped_while_serving(zoo, scratch, cache_root, postgres, untraced, tmp_path):
    """PostgreSQL stops while an engine serves: same tokens, drops counted; back: rows arrive again."""
    data, back = tmp_path / "lake-data", tmp_path / "catalog-back"
    specs = [spec(zoo, "outage", "self", repeat=12), spec(zoo, "after", "self", wait_for_file=str(back))]
    env = lake_env(postgres, data, "replica-c", SPECTRACE_MAX_BUFFER_ROWS="200")
    results: dict = {}
    child = threading.Thread(target=lambda: results.update(run_engines(
        specs, store=tmp_path / "store", scratch=scratch, cache_root=cache_root, env=env,
        log_file=scratch / "lake-outage.log")))
    child.start()

    def rows_in_lake() -> int:
        try:
            con = lake.open(postgres.catalog)
        except Exception:
            return 0
        try:
            return con.execute("select (select count(*) from verify_steps) + (select count(*) from spans)").fetchone()[0]
        finally:
            con.close()

    try:
        deadline = time.time() + 300
        while rows_in_lake() == 0:  # the engine is decoding: its first verification rows are in
            assert child.is_alive() and time.time() < deadline, "no verification rows reached the lake"
            time.sleep(0.2)
        postgres.stop()
        waiting = Path(f"{back}.waiting")
        while not waiting.exists():  # the outage engine is done (and flushed, against a stopped catalog)
            assert child.is_alive() and time.time() < deadline, "the outage engine did not finish"
            time.sleep(0.2)
        before_restart = None
        postgres.restart()
        before_restart = rows_in_lake()
        settled = before_restart
        while True:  # the rows kept during the outage arrive (the sink retries within 10 s)
            time.sleep(1)
            now = rows_in_lake()
            if now == settled and now > before_restart:
                break
            assert time.time() < deadline, "no rows arrived after the catalog came back"
            settled = now
    finally:
        if not postgres.data.joinpath("postmaster.pid").exists():
            postgres.restart()
        back.touch()
        child.join(timeout=600)

    outage, after = results["outage"], results["after"]
    assert outage.ok and after.ok, (outage.error, after.error)
    assert outage.tokens == untraced["self"].tokens
    assert after.tokens == untraced["self"].tokens
    sink = outage.exporter["lake"]
    # every row lost is the lake's or the pipeline's bounded buffer's (200 rows here: it refuses rows when a flush comes
    # late, on the catalog's connection or for a CPU; a full run once counted 394 in all against the lake's 284)
    assert sink["dropped"] > 0
    assert outage.exporter["dropped"] == sink["dropped"] + outage.exporter["buffer_dropped"], (outage.exporter, sink)
    assert sink["failures"] > 0 and "Connection refused" in sink["last_error"]
    # back: the next engine's rows all arrive, none dropped
    assert after.exporter["dropped"] == outage.exporter["dropped"]
    con = lake.open(postgres.catalog)
    accepted = [row[0] for row in con.execute(
        "select sum(accepted) from verify_counts where run_id = ? and source = 'engine_core' group by position "
        "order by position", [after.run_id]).fetchall()]
    assert accepted == after.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    lost = con.execute("select sum(drafted) from verify_counts where run_id = ? and source = 'engine_core'",
                       [outage.run_id]).fetchone()[0] or 0
    con.close()
    assert lost <= outage.metrics["vllm:spec_decode_num_draft_tokens"]
    print(f"\noutage: {outage.seconds} s (untraced engine {untraced['self'].seconds} s); drafted in lake {lost} of "
          f"{outage.metrics['vllm:spec_decode_num_draft_tokens']};", sink, after.exporter["lake"])
