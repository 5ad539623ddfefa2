"""Every subcommand's bad input: one line on stderr, exit 2, never a traceback (fast, no vLLM)."""

from __future__ import annotations

import pytest

from spectrace.cli import main


def _one_line(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (argv, err)
    assert err.count("\n") == 1 and err.startswith("spectrace: error: "), err
    assert "Traceback" not in err
    return err


def test_named_takes_only_shipped_names(tmp_path, capsys):
    (tmp_path / "x.sql").write_text("select 42")
    err = _one_line(capsys, ["query", "--named", str(tmp_path / "x"), "--dir", str(tmp_path)])
    assert "no named query" in err
    err = _one_line(capsys, ["query", "--named", "../../x", "--dir", str(tmp_path)])
    assert "no named query '../../x'" in err


def test_query_help_lists_every_named_query_with_what_it_answers(capsys):
    from spectrace.queries import named

    assert main(["query", "--help"]) == 0
    out = capsys.readouterr().out
    listed = out.split("named queries (--named NAME):\n", 1)[1].splitlines()
    rows = {line.split()[0]: line for line in listed if not line.startswith(" " * 3)}
    assert sorted(rows) == named.names() and len(rows) == 8
    assert "Runs whose acceptance collapsed: position-0" in rows["acceptance_collapse"]
    assert max(map(len, listed)) <= 100


def test_empty_query_names_the_named_queries(tmp_path, capsys):
    err = _one_line(capsys, ["query", "--dir", str(tmp_path)])
    assert "--list" not in err and "acceptance_by_position" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["query", "select 1", "--dir", "/nonexistent/store"], "no spectrace store"),
        (["query", "select 1", "--since", "soon"], "not a duration"),
        (["report", "--dir", "/nonexistent/store"], "no spectrace store"),
        (["store", "stats", "--dir", "/nonexistent/store"], "no spectrace store"),
        (["store", "compact", "--idle", "-"], "not a duration"),
        (["lake", "maintain", "--retention", "soon"], "not a duration"),
        (["doctor", "--target", "/nonexistent"], "needs --draft"),
        (["dashboards", "export"], "required"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, needle):
    assert needle in _one_line(capsys, argv)


@pytest.mark.parametrize("name, value, argv, needle", [
    ("SPECTRACE_PIPELINE", "proces", ["query", "select 1"], "SPECTRACE_PIPELINE='proces' is not one of auto, thread, process"),
    ("SPECTRACE_RETENTION", "-5d", ["report"], "SPECTRACE_RETENTION='-5d' is out of range"),
    ("SPECTRACE_FLUSH_INTERVAL", "soon", ["store", "stats"], "SPECTRACE_FLUSH_INTERVAL='soon' is not a duration"),
    ("SPECTRACE_MAX_MB", "-1", ["top", "--once"], "SPECTRACE_MAX_MB='-1' is out of range"),
    ("SPECTRACE_HOST", "..", ["diff", "a", "b"], "SPECTRACE_HOST='..'"),
    ("SPECTRACE_EXPORTER", "duckdb,parquet", ["dashboards", "export", "x"], "unknown sink(s) parquet"),
    ("SPECTRACE_SHIP_INTERVAL", "0", ["lake", "maintain"], "SPECTRACE_SHIP_INTERVAL='0' is out of range"),
    ("SPECTRACE_STEP_SAMPLE", "2", ["doctor", "--target", "t", "--draft", "d"], "SPECTRACE_STEP_SAMPLE='2' is out of range"),
])
def test_every_command_checks_the_environment_it_reads(tmp_path, capsys, monkeypatch, name, value, argv, needle):
    """Every subcommand reads the settings the same way (``check_environment``): one line, exit 2, before its work
    (an empty store, a missing file, a URL that does not answer are never reached)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    err = _one_line(capsys, argv + (["--dir", str(tmp_path)] if argv[0] in ("query", "report", "store") else []))
    assert err.startswith("spectrace: error: environment: ") and needle in err, err
    monkeypatch.delenv(name)
    main(argv + (["--dir", str(tmp_path)] if argv[0] in ("query", "report", "store") else []))  # its own work, whatever it says
    assert "environment:" not in capsys.readouterr().err


def test_bad_setting_in_the_cli_is_one_line(tmp_path, capsys, monkeypatch):
    tmp_path.joinpath("x").mkdir()
    monkeypatch.setenv("SPECTRACE_HOST", "a/b")
    err = _one_line(capsys, ["store", "compact", "--dir", str(tmp_path / "x"), "--no-wait"])
    assert "SPECTRACE_HOST='a/b' must be one path component" in err


def test_permission_error_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    from spectrace.cli import store as store_cli

    def denied(root):
        raise PermissionError(13, "Permission denied", str(root / "runs"))

    monkeypatch.setattr(store_cli, "stats", denied)
    err = _one_line(capsys, ["store", "stats", "--dir", str(tmp_path)])
    assert err == f"spectrace: error: Permission denied: {tmp_path / 'runs'}\n"
    with pytest.raises(PermissionError):
        main(["store", "stats", "--dir", str(tmp_path), "--debug"])


def test_query_table_rounds_for_reading_and_csv_json_keep_the_raw_values(capsys, monkeypatch):
    import duckdb

    from spectrace.cli import query as query_cli

    monkeypatch.setattr(query_cli, "open_source", lambda args: duckdb.connect())
    sql = ("select 25/178 as draft_acceptance_rate, 25/178 as ratio, 1234567.891::DOUBLE as step_ns, 2.21348 as length, "
           "42 as steps, 'a' as name")
    assert main(["query", sql]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].split() == ["14.0%", "0.1404", "1234568", "2.213", "42", "a"], out
    assert main(["query", sql, "--format", "json"]) == 0
    raw = __import__("json").loads(capsys.readouterr().out)[0]
    assert raw["draft_acceptance_rate"] == 25 / 178 and raw["step_ns"] == 1234567.891
    assert main(["query", sql, "--format", "csv"]) == 0
    assert str(25 / 178) in capsys.readouterr().out
