"""The hardening classes through a real traced engine (vLLM's LLM, CPU): one engine run that holds a
secret in the lake catalog and in the OTLP headers, serves a drafter whose config.json declares 1.9 million tapped
layer ids, the last 1e308, and writes into a store where a foreign-typed segment was
planted in its own run folder, named as a dead writer's segment (compaction runs every second).
The engine must generate as untraced, log and store no secret, keep its findings bounded, and the
store must answer the report, a locked query and compaction afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spectrace.store
from spectrace.cli import main
from spectrace.testing.engine import EngineSpec, run_engines
from spectrace.testing.prometheus import free_port

pytestmark = [pytest.mark.vllm]

PASSWORD = "Kx9;live&pw,7"  # a libpq password with every separator that once ended the redaction
TOKEN = "otlp-bearer-token-live-42"
IDS = 1_900_000
# (every table: the recorded configs are cut at spectrace.console.RECORDED_ITEMS items a list, with a count)
WHOLE_CONFIGS: set[str] = set()
RUN = "hardening-probe"
HOST = "probehost"


def _dead_pid() -> int:
    done = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True)
    return int(done.stdout)


@pytest.fixture(scope="module")
def probed(zoo, scratch, cache_root):
    from spectrace.testing.models import build_eagle3

    # hostile values that only spectrace reads (vLLM itself refuses a rope factor or a DFlash window of 1e308, and
    # sizes DFlash's fc from a top-level target_layer_ids: a 124 GB allocation for 1.9 million ids)
    listed = build_eagle3(scratch / "hardening-models" / "eagle3-hostile-ids", target_dir=zoo["target_zero"],
                          aux_layer_ids=None)
    config = json.loads((listed / "config.json").read_text())
    config["eagle_config"] = {"layer_ids": [1] * (IDS - 1) + [1e308]}  # spectrace's tap audit reads it, no vLLM runner
    (listed / "config.json").write_text(json.dumps(config))
    store = scratch / "hardening-store"
    folder = store / "verify_counts" / f"run={RUN}"
    folder.mkdir(parents=True)
    planted = folder / f"{HOST}-{_dead_pid()}-{time.time_ns() - 10**9}-000001.parquet"  # a dead writer's raw segment
    pq.write_table(pa.table({"run_id": [RUN], "source": ["engine_core"], "position": [0], "drafted": ["ten"],
                             "accepted": ["five"]}), planted)
    planted_bytes = planted.read_bytes()
    specs = [  # the prompts and length of the untraced eagle3 run (the same target)
        EngineSpec(name="eagle3", target=zoo["target_zero"],
                   speculative={"method": "eagle3", "model": str(listed), "num_speculative_tokens": 3}),
    ]
    log = scratch / "hardening-engine.log"
    env = {
        "SPECTRACE_EXPORTER": "duckdb,otlp,lake",
        "SPECTRACE_LAKE": f"postgres:dbname=spectrace host=127.0.0.1 port=1 user=u password={PASSWORD}",
        "SPECTRACE_LAKE_DATA": str(scratch / "hardening-lake-data"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # nothing listens: exports fail, logged
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {TOKEN},x-api-key={TOKEN}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2", "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "SPECTRACE_RUN_ID": RUN, "SPECTRACE_HOST": HOST, "SPECTRACE_COMPACT_INTERVAL": "1", "SPECTRACE_FLUSH_INTERVAL": "0.5",
    }
    started = time.time()
    results = run_engines(specs, store=store, cache_root=cache_root, log_file=log, env=env)
    return {"results": results, "store": store, "log": log.read_text(), "planted": planted, "planted_bytes": planted_bytes,
            "seconds": time.time() - started}


def test_the_engine_generates_as_the_target_and_the_planted_segment_is_left_as_it_was(probed, untraced_methods):
    for name, result in probed["results"].items():
        assert result.ok, (name, result.error)
        assert result.tokens == untraced_methods[name].tokens, name  # greedy: the zero-norm target's own tokens
    assert probed["planted"].read_bytes() == probed["planted_bytes"]  # compaction never merged nor removed it
    print(f"\nhardening engines: {probed['seconds']:.0f} s")


def test_no_secret_reaches_the_engines_log_or_its_rows(probed):
    log = probed["log"]
    assert PASSWORD not in log and TOKEN not in log
    for part in PASSWORD.split(";") + PASSWORD.split("&") + PASSWORD.split(","):  # no tail past a separator either
        if len(part) >= 4:
            assert part not in log, part
    assert "lake" in log.lower()  # the unreachable catalog was said, redacted
    for path in probed["store"].rglob("*.parquet"):
        table = pq.read_table(path)
        text = str(table.select([n for n, t in zip(table.column_names, table.schema.types) if t == pa.string()]).to_pylist())
        assert PASSWORD not in text and TOKEN not in text and "Kx9" not in text, path


def test_hostile_numbers_and_a_huge_list_reach_the_findings_bounded(probed, capsys):
    con = spectrace.store.open(probed["store"])
    rows = con.execute("select code, message, evidence from findings where run_id = ?", [RUN]).fetchall()
    codes = {code for code, _, _ in rows}
    assert codes & {"TAP_OUT_OF_RANGE", "TAP_COUNT_MISMATCH", "TAP_MISMATCH"}, codes  # the ids reached the audit
    assert "LOAD_FAILED" not in codes
    for code, message, evidence in rows:
        assert len(message) <= 2000 and len(evidence or "") < 20_000, code
    taps = con.execute("select declared_ids from hidden_state_taps where run_id = ? and declared_field = ?",
                       [RUN, "eagle_config.layer_ids"]).fetchall()
    assert taps and all(len(ids) < 2000 and f"more ({IDS} in all)" in ids for (ids,) in taps), taps
    assert len(probed["log"]) < 2_000_000  # the log holds no whole list either
    for path in probed["store"].rglob("*.parquet"):  # the 5.7 MB list is nowhere whole, in any table ...
        if path.parent.parent.name in WHOLE_CONFIGS:
            continue
        table = pq.read_table(path)
        longest = max((len(v) for col, kind in zip(table.columns, table.schema.types) if kind == pa.string()
                       for v in col.to_pylist() if v), default=0)
        assert longest < 100_000, (path, longest)


def test_the_report_locked_queries_and_compaction_answer_past_the_planted_segment(probed, capsys, caplog):
    store = probed["store"]
    assert main(["report", "--dir", str(store), "--run", RUN]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert f"skipping {probed['planted']}: not a verify_counts segment (column types drafted string" in caplog.text
    # locked, on the engine's own store: reads answer, a write into the engine's run folder is refused
    assert main(["query", "--locked", "--dir", str(store), "select sum(drafted) > 0 as counted from verify_counts"]) == 0
    assert "True" in capsys.readouterr().out
    forged = store / "verify_counts" / f"run={RUN}" / f"{HOST}-1-1-000009.parquet"
    for sql in (f"explain analyze copy (select '{RUN}' as run_id, 10**9 as drafted) to '{forged}'",
                f"select * from enable_logging(storage='file', storage_path='{store}/log')"):
        assert main(["query", "--locked", "--dir", str(store), sql]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("spectrace: error: ")
    assert not forged.exists() and not (store / "log").exists()
    assert main(["store", "compact", "--dir", str(store)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert probed["planted"].read_bytes() == probed["planted_bytes"]
    assert main(["report", "--dir", str(store), "--run", RUN]) == 0
