"""Hidden-state tap audit on real vLLM runs (V1 model runner on CPU)."""

from __future__ import annotations

import json

import pytest

import spectrace.store

pytestmark = pytest.mark.vllm


def _taps(con, run_id):
    row = con.execute(
        "select declared_field, declared_ids, expected_ids, tapped_ids, input_taps, status, process_role "
        "from hidden_state_taps where run_id = ?",
        [run_id],
    ).fetchone()
    assert row is not None
    field, declared, expected, tapped, inputs, status, role = row
    return field, json.loads(declared), json.loads(expected), json.loads(tapped), inputs, status, role


def _codes(con, run_id):
    return {r[0]: r[1:] for r in con.execute(
        "select code, severity, caused_by, message from findings where run_id = ? and code like 'TAP_%'", [run_id]
    ).fetchall()}


def test_eagle3_with_explicit_ids_taps_what_it_declares(tap_runs):
    con, results, _ = tap_runs
    result = results["eagle3_ids"]
    assert result.ok, result.error
    field, declared, expected, tapped, inputs, status, role = _taps(con, result.run_id)
    assert (field, declared, expected, tapped, inputs, status) == (
        "eagle_aux_hidden_state_layer_ids", [1, 4, 6], [1, 4, 6], [1, 4, 6], 3, "ok")
    assert role == "worker"
    # read as vLLM ids; who trained it cannot be told from its checkpoint (#58): said as info, nothing louder
    codes = _codes(con, result.run_id)
    assert set(codes) == {"TAP_CONVENTION"} and codes["TAP_CONVENTION"][:2] == ("info", None)
    capture = con.execute("select capture_point from hidden_state_taps where run_id = ?", [result.run_id]).fetchone()
    assert capture == ("the input of layer k: the residual stream (hidden_states + residual) before its input norm",)


def test_eagle3_without_ids_is_tap_defaulted(tap_runs):
    con, results, _ = tap_runs
    result = results["eagle3_noids"]
    assert result.ok, result.error
    field, declared, expected, tapped, _, status, _ = _taps(con, result.run_id)
    assert (field, declared, expected, status) == (None, None, None, "defaulted")
    assert tapped == [2, 4, 5]  # vLLM's default (2, n // 2, n - 3) for the 8-layer target
    codes = _codes(con, result.run_id)
    # info: vLLM's default is the one the common trainers train with (the severity policy); a collapse raises it
    assert set(codes) == {"TAP_DEFAULTED"} and codes["TAP_DEFAULTED"][0] == "info"
    assert "[2, 4, 5]" in codes["TAP_DEFAULTED"][2]


def test_dflash_config_ids_are_tapped_one_deeper(traced_methods):
    store, results = traced_methods
    con = spectrace.store.open(store)
    field, declared, expected, tapped, inputs, status, _ = _taps(con, results["dflash"].run_id)
    assert (field, declared, expected, tapped, inputs, status) == (
        "dflash_config.target_layer_ids", [1, 4, 6], [2, 5, 7], [2, 5, 7], 3, "ok")
    assert _codes(con, results["dflash"].run_id) == {}


def test_top_level_target_layer_ids_is_a_silent_mismatch_on_v1(tap_runs):
    """The V1 runner ignores top-level target_layer_ids and falls back to its default taps,
    while the DFlash fc is still sized for three: it runs, answers, and accepts nothing."""
    con, results, _ = tap_runs
    result = results["dflash_top_level"]
    assert result.ok, result.error  # generation succeeds: nothing fails loudly
    field, declared, expected, tapped, inputs, status, _ = _taps(con, result.run_id)
    assert (field, declared, expected, inputs) == ("target_layer_ids", [0, 3, 6], [1, 4, 7], 3)
    assert tapped == [2, 4, 5] and status == "mismatch"
    codes = _codes(con, result.run_id)
    assert set(codes) == {"TAP_MISMATCH"}
    assert codes["TAP_MISMATCH"][0] == "error" and codes["TAP_MISMATCH"][1] is None
    span = con.execute(
        "select attributes->>'spectrace.taps.status' from spans where run_id = ? and name = 'spectrace.hidden_states.taps'",
        [result.run_id],
    ).fetchone()
    assert span == ("mismatch",)
