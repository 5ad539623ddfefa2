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
