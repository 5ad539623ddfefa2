"""Hostile files in the store: a corrupt, empty or foreign file is skipped with one warning that
names it, every query answers from the rest, and compaction leaves it alone and carries on
(no vLLM: the real store pipeline, reader and compactor)."""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pyarrow.parquet as pq

import spectrace.store
from spectrace.store import compaction
from spectrace.testing import store_pipeline


def _store(root, n_flushes: int = 3):
    writer = store_pipeline(root, retention_s=0, compact_interval_s=60)
    writer.append("runs", {"run_id": "good", "method": "eagle3", "started_at": time.time_ns()})
    for i in range(n_flushes):
        writer.extend("verify_counts", [{"run_id": "good", "source": "engine_core", "position": p, "drafted": 10, "accepted": 5,
                                         "ts": time.time_ns()} for p in range(3)])
        writer.flush()
    return writer


def _plant(root):
    """Every kind of bad file, beside the good segments, named as segments are."""
    folder = root / "verify_counts" / "run=good"
    bad = {
        "empty": folder / "evil-1-1000-000001.parquet",
        "text": folder / "evil-1-1001-000002.parquet",
        "truncated": folder / "evil-1-1002-000003.parquet",
        "foreign": folder / "evil-1-1003-000004.parquet",
        "directory": folder / "evil-1-1004-000005.parquet",
    }
    bad["empty"].write_bytes(b"")
    bad["text"].write_text("this is not parquet\n")
    good = next(p for p in sorted(folder.glob("testhost-*.parquet")))
    bad["truncated"].write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    pq.write_table(pa.table({"password": ["x"], "drafted": [10**9]}), bad["foreign"])
    bad["directory"].mkdir()
    return bad


def test_bad_files_are_skipped_and_named_and_the_rest_answers(tmp_path, caplog):
    _store(tmp_path)
    bad = _plant(tmp_path)
    caplog.set_level(logging.WARNING)
    con = spectrace.store.open(tmp_path)
    assert con.execute("select sum(drafted), sum(accepted) from verify_counts").fetchone() == (90, 45)
    assert con.execute("select run_id, method from runs").fetchall() == [("good", "eagle3")]  # every view, runs included
    assert con.execute("select count(*) from acceptance_by_position").fetchone()[0] == 3
    assert set(con.skipped) == {str(p) for p in bad.values()}
    assert "foreign columns" not in con.skipped[str(bad["foreign"])] and "password" in con.skipped[str(bad["foreign"])]
    warned = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(warned) == 5 and all(any(str(p) in w for w in warned) for p in bad.values())
    con.execute("select 1")  # another query: no second warning for the same files
    assert len([r for r in caplog.records if "skipping" in r.getMessage()]) == 5


def test_compaction_leaves_bad_files_alone_and_compacts_the_rest(tmp_path, caplog):
    writer = _store(tmp_path)
    bad = _plant(tmp_path)
    # a bad file of this writer's own in another run: its group stays raw, the other run is merged
    own = tmp_path / "verify_counts" / "run=other"
    writer.extend("verify_counts", [{"run_id": "other", "source": "engine_core", "position": 0, "drafted": 1, "accepted": 1,
                                     "ts": time.time_ns()}])
    writer.flush()
    store = writer.sink("duckdb")
    name = next(own.glob("*.parquet")).name
    host_pid, t, seq = name.removesuffix(".parquet").rsplit("-", 2)
    corrupt = own / f"{host_pid}-{int(t) + 1}-{int(seq) + 1:06d}.parquet"
    corrupt.write_bytes(b"PAR1 not really")
    store._last_t = int(t) + 1  # the writer named it (as if written by it, then damaged on disk)
    caplog.set_level(logging.WARNING)
    writer.maintain()
    assert store.compaction_errors == 0
    merged = list((tmp_path / "verify_counts" / "run=good").glob("*.part.parquet"))
    assert len(merged) == 1  # the good run's own raw segments were merged
    assert all(p.exists() for p in bad.values()) and corrupt.exists()  # nothing bad deleted or merged
    assert not list(own.glob("*.part.parquet"))
    assert any(str(own) in r.getMessage() for r in caplog.records if "compaction leaves" in r.getMessage())
    con = spectrace.store.open(tmp_path)
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 91


def test_store_compact_never_merges_a_file_of_another_schema(tmp_path):
    folder = tmp_path / "verify_counts" / "run=r"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"run_id": ["r"], "drafted": [1]}), folder / "gone-1-1000-000001.parquet")
    pq.write_table(pa.table({"secret": ["s"], "drafted": [7]}), folder / "gone-1-1001-000002.parquet")
    result = compaction.Compactor(tmp_path, lambda seg: True, closed=lambda hour, now: True).cycle()
    assert result.files_written == 0 and any("gone-1-1001" in p for p in result.skipped)
    assert sorted(p.name for p in folder.iterdir()) == ["gone-1-1000-000001.parquet", "gone-1-1001-000002.parquet"]


# -- secrets -----------------------------------------------------------------------

from spectrace.redact import redact  # noqa: E402

SECRETS = ["hunter2", "s3cr3t pass", "glsa_abcdefghijklmnop_1234", "tok_123456"]


def test_redact_hides_every_secret_form_and_keeps_the_rest():
    cases = {
        "postgres:dbname=spectrace host=db user=sp password=hunter2": "postgres:dbname=spectrace host=db user=sp password=***",
        "host=db password='s3cr3t pass' port=5432": "host=db password=*** port=5432",
        "postgresql://sp:hunter2@db:5432/spectrace": "postgresql://sp:***@db:5432/spectrace",
        "http://admin:hunter2@grafana:3000/": "http://admin:***@grafana:3000/",
        "PGPASSWORD=hunter2 psql": "PGPASSWORD=*** psql",
        "Authorization: Bearer glsa_abcdefghijklmnop_1234": "Authorization: Bearer ***",
        "https://x/?token=tok_123456&a=1": "https://x/?token=***&a=1",
        "nothing secret at http://grafana:3000/ here": "nothing secret at http://grafana:3000/ here",
    }
    for given, expected in cases.items():
        assert redact(given) == expected
    assert not any(secret in redact(" ".join(cases)) for secret in SECRETS)


def test_an_unreachable_lake_never_echoes_its_password(tmp_path, caplog, capsys):
    from spectrace.cli import main
    from spectrace.sinks import build
    from spectrace.settings import Settings

    catalog = "postgres:dbname=spectrace host=127.0.0.1 port=1 user=sp password=hunter2 connect_timeout=2"
    caplog.set_level(logging.DEBUG)
    pipeline, status = build(Settings(dir=tmp_path, exporters=("lake",), lake=catalog, lake_data=str(tmp_path / "data")))
    pipeline.append("runs", {"run_id": "r"})
    pipeline.flush()  # the sink tries the catalog: refused
    sink = pipeline.sink("lake")
    assert sink.failures == 1 and sink.last_error and "hunter2" not in sink.last_error
    pipeline.close()
    assert main(["query", "select 1", "--lake", catalog]) == 2
    out = capsys.readouterr()
    logged = " ".join(r.getMessage() for r in caplog.records)
    for text in (sink.last_error or "", out.out, out.err, logged, str(sink.stats())):
        assert "hunter2" not in text
    assert "password=***" in out.err  # the error still names the catalog it could not reach


# -- doctor: a config.json is input from anyone ----------------------------------------

import json as _json  # noqa: E402

import pytest  # noqa: E402


def _model(root, name: str, text: str):
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(text)
    return str(folder)


GOOD = _json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2})


@pytest.mark.parametrize("config, said", [
    (_json.dumps({"architectures": [None], "model_type": "qwen3"}), "architectures must be a list of class names"),
    ("[" * 100_000 + "]" * 100_000, "nests deeper than"),
    (_json.dumps({"model_type": "qwen3", "num_hidden_layers": 10**12}), "num_hidden_layers=1000000000000 is outside"),
    (_json.dumps({"model_type": "qwen3", "text_config": {"num_hidden_layers": -3}}), "text_config.num_hidden_layers=-3"),
    (_json.dumps({"model_type": "qwen3", "layer_types": ["full_attention"] * 5000}), "layer_types has 5000 entries"),
    ('{"model_type": "qwen3", "pad": "' + "x" * (5 << 20) + '"}', "larger than 4 MB"),
])
def test_doctor_refuses_a_hostile_config_in_one_line_before_transformers_sees_it(tmp_path, capsys, config, said):
    from spectrace.cli import main

    target, draft = _model(tmp_path, "target", GOOD), _model(tmp_path, "draft", config)
    assert main(["doctor", "--target", target, "--draft", draft]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
