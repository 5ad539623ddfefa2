"""Hostile files in the store: a corrupt, empty or foreign file is skipped with one warning that
names it, every query answers from the rest, and compaction leaves it alone and carries on
(no vLLM: the real store pipeline, reader and compactor)."""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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


def test_a_file_with_the_right_names_and_other_types_is_skipped_by_every_reader_and_by_compaction(tmp_path):
    import subprocess
    import sys

    writer = _store(tmp_path, n_flushes=2)
    writer.extend("verify_counts", [{"run_id": "other", "source": "engine_core", "position": 0, "drafted": 4, "accepted": 2,
                                     "ts": time.time_ns()}])
    writer.flush()
    writer.close()
    folder = tmp_path / "verify_counts" / "run=good"
    name = max(p.name for p in folder.glob("testhost-*.parquet"))  # planted in the writer's own group: its merge crashed
    host_pid, t, seq = name.removesuffix(".parquet").rsplit("-", 2)
    planted = folder / f"{host_pid}-{int(t) + 1}-{int(seq) + 1:06d}.parquet"
    pq.write_table(pa.table({"run_id": ["good"], "source": ["engine_core"], "drafted": ["lots"]}), planted)

    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "spectrace.cli", *argv, "--dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)

    done = cli("query", "--format", "json", "select sum(drafted) as d, sum(accepted) as a from verify_counts")
    assert done.returncode == 0 and _json.loads(done.stdout) == [{"d": 64, "a": 32}], done
    assert done.stderr.count(str(planted)) == 1 and "drafted string, not int64" in done.stderr
    done = cli("report")
    assert done.returncode == 0 and "Acceptance by position" in done.stdout, done
    done = cli("store", "compact", "--idle", "0", "--no-wait")  # the writer's host is not this one: gone when idle
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    assert done.stderr.count(str(planted)) == 1 and "column types drafted string" in done.stderr
    summary = dict(line.rsplit(None, 1) for line in done.stdout.splitlines()[2:])
    assert summary["files skipped"] == "1" and summary["files merged"] == "2", done.stdout  # runs and run=other merged
    assert planted.exists() and len(list(folder.glob("*.parquet"))) == 3 and not list(folder.glob("*.part.parquet"))
    assert list((tmp_path / "verify_counts" / "run=other").glob("*.hour.parquet"))
    stats = _json.loads(cli("store", "stats", "--format", "json").stdout)
    assert {row["table"]: row["skipped"] for row in stats}["verify_counts"] == 1


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


def test_redaction_masks_libpq_passwords_whole_and_every_form_of_a_known_secret(caplog):
    from spectrace import redact as redaction

    # shapes alone (a secret the process was never given): a libpq value runs to the next blank
    for password in ("ab;Kx9zz", "ab&Kx9zz", "ab,Kx9zz"):
        assert redact(f"host=db password={password} port=5432") == "host=db password=*** port=5432"
        assert "Kx9zz" not in redact(f'Unable to connect to Postgres at "dbname=x password={password} connect_timeout=5"')
    assert redact("at /work/postgresql:/sp:pw9secret@db:1/spectrace") == "at /work/postgresql:/sp:***@db:1/spectrace"
    # a secret the process knows of is masked in whatever form a library prints it
    redaction.remember("postgresql://sp:p%40ss;word@db/spectrace", "host=db password='it\\'s a secret'")  # libpq: \\' in quotes
    redaction.remember_token("glsb_not_a_known_shape")
    try:
        printed = ("file /cwd/postgresql:/sp:p@ss;word@db/spectrace, p%40ss;word, it's a secret, "
                   "Authorization: glsb_not_a_known_shape")
        assert not any(s in redact(printed) for s in ("p@ss;word", "p%40ss;word", "it's a secret", "glsb_not"))
        caplog.set_level(logging.INFO)
        logging.getLogger("vllm.spectrace").info("spectrace: lake %s failed: %s", "db", "p@ss;word")
        assert caplog.records[-1].getMessage() == "spectrace: lake db failed: ***"
        try:
            raise RuntimeError("cannot open /cwd/postgresql:/sp:p@ss;word@db")
        except RuntimeError as exc:
            logging.getLogger("spectrace.store").warning("spectrace: hook raised %s", exc, exc_info=exc)
        assert "p@ss;word" not in caplog.text and "RuntimeError: cannot open /cwd/postgresql:/sp:***@db" in caplog.text
    finally:
        redaction.forget()


def test_no_lake_command_echoes_a_password_past_its_separators(capsys):
    from spectrace.cli import main

    def libpq(password):
        return f"postgres:dbname=spectrace host=127.0.0.1 port=1 user=sp password={password} connect_timeout=2"

    def uri(password):
        return f"postgresql://sp:{password.replace('&', '%26')}@127.0.0.1:1/spectrace?connect_timeout=2"

    for argv in (["query", "select 1", "--lake", libpq("ab;Kx9zz")], ["lake", "maintain", "--catalog", libpq("ab&Kx9zz")],
                 ["report", "--lake", libpq("ab,Kx9zz")], ["query", "select 1", "--lake", uri("ab;Kx9zz")],
                 ["lake", "maintain", "--catalog", uri("ab&Kx9zz")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Kx9zz" not in err and "cannot attach the lake" in err, (argv, err)
        assert "Cannot open" not in err  # the URI went to libpq, not to DuckDB as a file path


def test_a_one_slash_catalog_uri_is_refused_in_one_line_and_nothing_is_created(tmp_path):
    import subprocess
    import sys

    for argv in (["query", "select 1", "--lake"], ["lake", "maintain", "--catalog"], ["report", "--lake"]):
        done = subprocess.run([sys.executable, "-m", "spectrace.cli", *argv, "postgresql:/sp:pw9secret@127.0.0.1:1/db"],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1 and "not a PostgreSQL URI" in done.stderr and "pw9secret" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # DuckDB never opened it as a file path


def test_dashboards_push_never_echoes_the_urls_password_when_grafana_is_unreachable():
    import subprocess
    import sys

    pytest.importorskip("grafana_client")
    from spectrace.testing.prometheus import free_port

    url = f"http://admin:pw9secret@127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "-m", "spectrace.cli", "dashboards", "push", "--url", url, "--timeout", "5"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "pw9secret" not in done.stdout + done.stderr, done
    assert done.stderr.count("\n") == 1 and "cannot reach Grafana at http://admin:***@127.0.0.1" in done.stderr


# -- numbers: NULL, non-finite and out-of-range values never crash a command -------------------


def test_null_and_non_finite_numbers_and_out_of_range_durations_are_said_not_crashed(tmp_path):
    import subprocess
    import sys

    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=60)
    writer.append("runs", {"run_id": "r", "method": "eagle3", "num_speculative_tokens": 3, "started_at": time.time_ns()})
    writer.extend("verify_counts", [{"run_id": "r", "source": "engine_core", "position": p, "drafted": d, "accepted": a,
                                     "ts": time.time_ns()} for p, d, a in ((0, 10, 5), (1, 10, 2), (2, 0, 0))])
    writer.close()

    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "spectrace.cli", *argv, "--dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)

    done = cli("report")  # position 2 drafted nothing: its rate is NULL
    assert done.returncode == 0 and done.stderr == "", done
    rates = [line.split() for line in done.stdout.split("Acceptance by position")[1].splitlines()[3:6]]
    assert rates == [["0", "10", "5", "50.0%"], ["1", "10", "2", "20.0%"], ["2", "0", "0", "-"]]
    done = cli("query", "--format", "json", "select position, rate, 'nan'::double as nan, 1e308 * 10 as inf, "
                                            "['-inf'::double, 1.5] as list from acceptance_by_position order by position")
    assert done.returncode == 0, done
    assert _json.loads(done.stdout)[2] == {"position": 2, "rate": None, "nan": None, "inf": None, "list": [None, 1.5]}
    assert "NaN" not in done.stdout and "Infinity" not in done.stdout  # what strict JSON parsers refuse
    for argv in (("query", "--since", "20000w", "select 1"), ("store", "compact", "--idle", "99999999999w")):
        done = cli(*argv)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done
        assert "out of range: longer than the time since 1970" in done.stderr and "Binder" not in done.stderr
    assert cli("query", "--since", "2000w", "select count(*) from verify_counts").returncode == 0


def test_a_million_entry_list_in_a_config_is_cut_with_a_count_in_every_finding():
    from spectrace.audit import audit_taps

    declared = [1] * 1_900_000
    tap, findings = audit_taps(draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": declared}}, target_layers=36,
                             tapped_ids=[2, 18, 33], input_taps=len(declared))
    assert {f.code for f in findings} == {"TAP_COUNT_MISMATCH", "TAP_MISMATCH"}
    for finding in findings:
        row = finding.as_row()
        assert len(row["message"]) < 500 and len(row["evidence"]) < 5000, finding.code
        assert _json.loads(row["evidence"])["declared_ids"][-1] == "... 1899744 more (1900000 in all)"
    assert "= [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ... 1899984 more (1900000 in all)]" in findings[1].message
    assert len(declared) == 1_900_000  # the caller's list is left whole
    row = tap.as_row()  # the live run's hidden_state_taps row
    assert _json.loads(row["declared_ids"])[-1] == "... 1899744 more (1900000 in all)" and len(row["declared_ids"]) < 2000


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


# -- file modes, links, durable writes ------------------------------------------------

import os  # noqa: E402
import stat as stat_mode  # noqa: E402

import pytest  # noqa: E402

from spectrace.cli import main  # noqa: E402
from spectrace import files as store_files  # noqa: E402


def _modes(root):
    """{relative path: mode} of every folder and file spectrace wrote under ``root``."""
    return {
        str(p.relative_to(root)): stat_mode.S_IMODE(p.stat().st_mode)
        for p in [root / name for name in ("verify_counts", "runs")] + sorted(root.glob("*/run=*")) + sorted(root.glob("*/run=*/*"))
        if p.exists()
    }


@pytest.mark.parametrize("group, umask, folder_mode, file_mode", [(False, 0o022, 0o700, 0o600), (True, 0o077, 0o750, 0o640)])
def test_the_store_is_private_by_default_and_group_readable_when_asked(tmp_path, group, umask, folder_mode, file_mode):
    old = os.umask(umask)
    try:
        writer = store_pipeline(tmp_path / "store", retention_s=0, compact_interval_s=60, store_group=group)
        _fill(writer)
        writer.sink("duckdb").clock = lambda: time.time_ns() + 2 * compaction.HOUR_NS  # the hour is over: an hour file
        writer.maintain()
    finally:
        os.umask(old)
    modes = _modes(tmp_path / "store")
    folders = {p: m for p, m in modes.items() if not p.endswith(".parquet")}
    segments = {p: m for p, m in modes.items() if p.endswith(".parquet")}
    assert set(folders.values()) == {folder_mode} and len(folders) >= 4
    assert set(segments.values()) == {file_mode}, segments
    assert any(p.endswith(".hour.parquet") for p in segments)  # compaction's file has its inputs' mode
    assert stat_mode.S_IMODE((tmp_path / "store").stat().st_mode) == folder_mode


def _fill(writer):
    writer.append("runs", {"run_id": "good", "method": "eagle3", "started_at": time.time_ns()})
    writer.extend("verify_counts", [{"run_id": "good", "source": "engine_core", "position": 0, "drafted": 4, "accepted": 2,
                                     "ts": time.time_ns()}])
    writer.flush()


def test_a_temporary_file_is_never_written_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    os.chmod(victim, 0o600)
    tmp = tmp_path / ".seg.parquet.tmp"
    tmp.symlink_to(victim)
    with pytest.raises(FileExistsError):
        store_files.write_durably(tmp, tmp_path / "seg.parquet", 0o600, lambda out: out.write(b"x"))
    assert victim.read_text() == "root's file\n" and tmp.is_symlink() and not (tmp_path / "seg.parquet").exists()


def test_links_and_special_files_in_the_store_are_skipped_and_counted(tmp_path, capsys):
    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=60)
    _fill(writer)
    folder = tmp_path / "verify_counts" / "run=good"
    outside = tmp_path.parent / f"{tmp_path.name}-outside.parquet"
    pq.write_table(pa.table({"run_id": ["good"], "drafted": [10**6]}), outside)  # a valid segment, outside the store
    (folder / "evil-1-2000-000001.parquet").symlink_to(outside)
    os.mkfifo(folder / "evil-1-2001-000002.parquet")  # a FIFO: opening it would block the query
    con = spectrace.store.open(tmp_path)
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 4
    assert {os.path.basename(p): why for p, why in con.skipped.items()} == {
        "evil-1-2000-000001.parquet": "not a regular file", "evil-1-2001-000002.parquet": "not a regular file",
    }
    assert main(["store", "stats", "--dir", str(tmp_path), "--format", "json"]) == 0
    out = capsys.readouterr()
    import json

    by_table = {row["table"]: row for row in json.loads(out.out)}
    assert by_table["verify_counts"]["skipped"] == 2 and by_table["verify_counts"]["rows"] == 1
    assert by_table["runs"]["skipped"] == 0
    import subprocess
    import sys

    done = subprocess.run(  # as a user runs it: the skipped files named on stderr, the count in the table
        [sys.executable, "-m", "spectrace.cli", "store", "stats", "--dir", str(tmp_path)], capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "2 skipped" in done.stdout, done
    assert "evil-1-2000-000001.parquet: not a regular file" in done.stderr and "Traceback" not in done.stderr


# -- the locked query mode ------------------------------------------------------------


def test_a_locked_store_reads_the_store_and_nothing_else(tmp_path, capsys):
    store_root = tmp_path / "store"
    _fill(store_pipeline(store_root, retention_s=0, compact_interval_s=60))
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    con = spectrace.store.open(store_root, locked=True)
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 4
    assert con.execute("explain select * from runs").fetchall()
    assert con.execute("explain /* a */ analyze select count(*) from verify_counts").fetchall()  # reads: allowed
    refused = {
        f"select * from read_csv('{secret}')": "disabled by configuration",
        f"copy (select 1) to '{store_root}/verify_counts/run=good/x-1-1-000001.parquet'": "only SELECT",
        f"attach '{tmp_path}/other.db'": "only SELECT",
        "set enable_external_access = true": "only SELECT",
        "install httpfs": "only SELECT",
        "select 1; drop view runs": "only SELECT",
        # EXPLAIN ANALYZE runs what it explains: the statement under it is checked, comments and options skipped
        f"explain analyze copy (select 'good' as run_id, 10**9 as drafted) to '{store_root}/verify_counts/run=good/"
        "x-1-2-000001.parquet'": "not EXPLAIN COPY",
        f"EXPLAIN /* */ ANALYZE /* */ COPY runs TO '{store_root}/runs/run=good/x-1-3-000001.parquet'": "not EXPLAIN COPY",
        f"explain (analyze, format json) copy runs to '{store_root}/x.csv'": "not EXPLAIN COPY",
        "explain analyze create table t as select 1": "not EXPLAIN CREATE",
        f"select * from read_parquet('{store_root}/../secret.csv')": "disabled by configuration",
    }
    import duckdb

    for sql, said in refused.items():
        with pytest.raises((spectrace.store.StoreError, duckdb.Error)) as info:
            con.execute(sql)
        assert said in str(info.value), (sql, info.value)
    assert con.execute("select count(*) from runs").fetchone()[0] == 1  # the views are all still there
    assert not list(store_root.glob("*/run=good/x-*")) and not (store_root / "x.csv").exists()
    for sql in (f"select * from read_csv('{secret}')", f"copy runs to '{store_root}/x.csv'",
                f"explain analyze copy runs to '{store_root}/runs/run=good/x-1-4-000001.parquet'"):
        assert main(["query", "--locked", "--dir", str(store_root), sql]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("spectrace: error: ") and "hunter2" not in err
    assert main(["query", "--locked", "--dir", str(store_root), "--named", "acceptance_by_position"]) == 0
    assert "(1 row)" in capsys.readouterr().out
    assert main(["query", "--dir", str(store_root), f"select * from read_csv('{secret}')"]) == 0  # the operator's mode
    assert "hunter2" in capsys.readouterr().out


# -- another user's folders and files ----------------------------------------------------

NOBODY = 65534


def _as_nobody(path):
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    return path


def test_a_folder_of_another_user_is_refused_and_a_widened_one_made_private(tmp_path, caplog):
    root = tmp_path / "store"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)  # a careless operator's store
    planted = root / "verify_counts"
    planted.mkdir(mode=0o777)
    _as_nobody(planted)
    os.chmod(planted, 0o777)
    caplog.set_level(logging.WARNING)
    writer = store_pipeline(root, retention_s=0, compact_interval_s=60)
    _fill(writer)
    store = writer.sink("duckdb")
    assert stat_mode.S_IMODE(root.stat().st_mode) == 0o700  # ours: made private, and said
    assert any("was mode 0777" in r.getMessage() for r in caplog.records)
    assert list((root / "runs").glob("run=good/*.parquet"))  # the other tables are written
    assert not list(planted.rglob("*.parquet"))  # nothing written where another user can reach it
    assert store.write_errors == 1 and store.dropped == 1
    [line] = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert f"owned by uid {NOBODY}" in line and "refused" in line


def test_another_users_files_are_never_read_merged_counted_or_deleted(tmp_path, caplog):
    writer = store_pipeline(tmp_path, retention_s=3600, compact_interval_s=60, max_mb=1)
    _fill(writer)
    folder = tmp_path / "verify_counts" / "run=good"
    forged = folder / "testhost-1-1000-000001.parquet"  # a valid segment, named as an old one of ours
    pq.write_table(pa.table({"run_id": ["good"], "drafted": [10**6], "ts": pa.array([1000], pa.timestamp("ns"))}), forged)
    big = folder / "testhost-1-1001-000002.parquet"
    with open(big, "wb") as f:  # 50 MB (sparse): far over SPECTRACE_MAX_MB=1 if it were counted
        f.truncate(50 << 20)
    for path in (forged, big):
        _as_nobody(path)
    earlier = tmp_path / "runs" / "run=earlier"
    earlier_writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    earlier_writer.append("runs", {"run_id": "earlier", "method": "mtp", "started_at": time.time_ns()})
    earlier_writer.flush()
    old = time.time() - 3600
    for path in earlier.iterdir():
        os.utime(path, (old, old))  # finished an hour ago: the cap could evict it
    caplog.set_level(logging.WARNING)
    writer.maintain()
    assert forged.exists() and big.exists()  # retention (an hour) would remove a file named t=1000 ns if ours
    assert list(earlier.iterdir())  # the 50 MB file is not ours: not counted, the earlier run is not evicted
    assert not [r for r in caplog.records if "over SPECTRACE_MAX_MB" in r.getMessage()]
    con = spectrace.store.open(tmp_path)
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 4
    assert con.execute("select count(*) from runs").fetchone()[0] == 2
    assert con.skipped[str(forged)] == f"owned by uid {NOBODY}, not the store's owner (uid {os.getuid()})"
