"""The readings a probe serves: the pair as vLLM resolves it, each fix doctor's findings propose, a tap sweep and
the target's RoPE base. Pure: a doctor report (as ``Report.as_dict()``) and the two config.json dicts in, a list of
:class:`Candidate` out; :func:`apply` writes one candidate's change into a copy of the drafter's config.

Tap ids here are vLLM's (id k: the target's hidden state after k layers, id 0 the embeddings), whatever field the
drafter declares them in; :func:`apply` writes them where vLLM reads them for this checkpoint format.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from spectrace.audit import codes

FAMILIES = ("fixes", "taps", "rope")  # --readings: which candidates to serve besides the pair as it is


@dataclass
class Candidate:
    name: str  # short, unique: "served", "taps [1, 2, 3]", "fix SWA_DROPPED", "rope 10000"
    kind: str  # served | fix | taps | rope | causal
    reading: str  # what a winning verdict says: "trained on taps [1, 2, 3]"
    patch: dict[str, Any] = field(default_factory=dict)  # {path: value}; "layer." paths: the layer config
    source: str | None = None  # the finding code whose fix or doubt proposed it
    note: str = ""  # why it is a candidate (a convention's name)
    skipped: str | None = None  # why it is not served (a count the drafter cannot take)
    taps: list[int] | None = None  # vLLM tap ids this reading serves (taps candidates and the served one)


def layer_config(config: dict[str, Any]) -> dict[str, Any]:
    """The dict holding the drafter's layer fields: speculators' ``transformer_layer_config``, else the config."""
    inner = config.get("transformer_layer_config")
    return inner if isinstance(inner, dict) else config


def is_speculators(config: dict[str, Any]) -> bool:
    return isinstance(config.get("speculators_config"), dict) or "speculators_model_type" in config


def num_layers(config: dict[str, Any]) -> int | None:
    for holder in (config, config.get("text_config") or {}):
        value = holder.get("num_hidden_layers") if isinstance(holder, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def vllm_default_taps(n: int) -> list[int]:
    """``get_eagle3_default_aux_hidden_state_layers``: (2, N//2, N-3), as ``set_aux_hidden_state_layers`` keeps them
    (sorted, de-duplicated)."""
    return sorted({2, n // 2, n - 3})


def evenly_spaced_taps(n: int, count: int) -> list[int]:
    """z-lab DFlash's ``build_target_layer_ids(N, count)`` (target_layer_ids from layer 1 to N-3), as vLLM ids (+1)."""
    if count == 1:
        ids = [n // 2]
    else:
        start, end = 1, n - 3
        ids = [int(round(start + i * (end - start) / (count - 1))) for i in range(count)]
    return sorted({i + 1 for i in ids})


def tap_sweep(served: list[int] | None, declared: list[int] | None, n: int | None, count: int | None) -> list[Candidate]:
    """The tap readings: the declared ids, each one-layer shift of the whole set, vLLM's default, z-lab's evenly
    spaced convention; one candidate per distinct set, never the served set again. A set with ids outside
    [0, N] or with another count than the drafter's input takes is listed as skipped."""
    if not n or not served:
        return []
    count = count or len(served)
    proposals: list[tuple[list[int], str]] = []
    if declared:
        proposals.append((sorted(set(declared)), "the declared ids read verbatim"))
    proposals += [
        ([i - 1 for i in served], "every tap one layer shallower"),
        ([i + 1 for i in served], "every tap one layer deeper"),
        (vllm_default_taps(n), "vLLM's default (2, N//2, N-3), what speculators, SpecForge and the EAGLE-3 reference train with"),
        (evenly_spaced_taps(n, count), "evenly spaced from layer 1 to N-3 (z-lab DFlash's build_target_layer_ids)"),
    ]
    seen = {tuple(sorted(served))}
    out: list[Candidate] = []
    for ids, note in proposals:
        ids = sorted(set(ids))
        if tuple(ids) in seen:
            continue
        seen.add(tuple(ids))
        skipped = None
        if any(i < 0 or i > n for i in ids):
            skipped = f"ids outside the target's 0..{n}"
        elif len(ids) != count:
            skipped = f"{len(ids)} distinct ids; the drafter's input takes {count}"
        out.append(Candidate(name=f"taps {ids}", kind="taps", reading=f"trained on taps {ids}",
                             patch={"taps": ids}, note=note, skipped=skipped, taps=ids))
    return out


def _finding_codes(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["code"]: f for f in report.get("findings", [])}


def fixes(report: dict[str, Any], draft_config: dict[str, Any]) -> list[Candidate]:
    """The fixes of doctor's findings that are a config change this module can make."""
    found = _finding_codes(report)
    layer = layer_config(draft_config)
    out: list[Candidate] = []
    swa = found.get(codes.SWA_DROPPED)
    if swa is not None:
        declared = (swa.get("evidence") or {}).get("declared") or {}
        window = declared.get("sliding_window") or layer.get("sliding_window")
        layers = layer.get("num_hidden_layers") or 1
        types = declared.get("layer_types") or ["sliding_attention"] * layers
        if window:
            out.append(Candidate(
                name="fix SWA_DROPPED", kind="fix", source=codes.SWA_DROPPED,
                reading=f"trained with its sliding window ({window}) declared",
                patch={"layer.use_sliding_window": True, "layer.layer_types": types, "layer.sliding_window": window},
                note=f"{codes.SWA_DROPPED}'s fix: use_sliding_window true, layer_types {types}"))
    if codes.CAUSAL_INFERRED in found:
        for causal in (True, False):
            out.append(Candidate(
                name=f"causal {str(causal).lower()}", kind="causal", source=codes.CAUSAL_INFERRED,
                reading=f"trained {'causal' if causal else 'non-causal (bidirectional)'}",
                patch={"dflash_config.causal": causal}, note=f"{codes.CAUSAL_INFERRED}'s fix, each way"))
    return out


def rope(report: dict[str, Any]) -> list[Candidate]:
    """The target's RoPE base, where the drafter's own differs (the drafter's own is the served reading)."""
    models = report.get("models") or {}
    target = ((models.get("target") or {}).get("rope") or {}).get("theta")
    draft = ((models.get("draft") or {}).get("rope") or {}).get("theta")
    if not target or not draft or target == draft:
        return []
    found = _finding_codes(report)
    source = next((c for c in (codes.ROPE_MISMATCH, codes.ROPE_DIFFERS) if c in found), None)
    return [Candidate(name=f"rope {target:g}", kind="rope", source=source,
                      reading=f"trained with the target's RoPE base {target:g}",
                      patch={"rope_theta": target}, note=f"the target's base (the drafter declares {draft:g})")]


def candidates(report: dict[str, Any], draft_config: dict[str, Any], target_config: dict[str, Any],
               families: tuple[str, ...] = FAMILIES) -> list[Candidate]:
    """The served reading first, then every other family in ``families``."""
    taps = report.get("taps") or {}
    served_taps = taps.get("tapped_ids")
    out = [Candidate(name="served", kind="served", reading="as served", taps=served_taps,
                     note="the pair as this vLLM resolves it")]
    if "fixes" in families:
        out += fixes(report, draft_config)
    if "rope" in families:
        out += rope(report)
    if "taps" in families:
        sweep = tap_sweep(served_taps, _declared_vllm_ids(taps), num_layers(target_config), taps.get("input_taps"))
        doubt = next((c for c in (codes.TAP_DEFAULTED, codes.TAP_MISMATCH) if c in _finding_codes(report)), None)
        for c in sweep:
            c.source = doubt
        out += sweep
    names: set[str] = set()
    unique = []
    for c in out:
        if c.name not in names:
            names.add(c.name)
            unique.append(c)
    return unique


def _declared_vllm_ids(taps: dict[str, Any]) -> list[int] | None:
    """The declared ids as vLLM reads their field (``expected_ids``), else as written."""
    return taps.get("expected_ids") or taps.get("declared_ids") or None


def not_probed(report: dict[str, Any], served: list[Candidate]) -> list[str]:
    """Codes of doctor's error and warning findings no candidate tests (their fix is no config change made here)."""
    tested = {c.source for c in served}
    tested |= {codes.TAP_DEFAULTED, codes.TAP_MISMATCH} if any(c.kind == "taps" for c in served) else set()
    tested |= {codes.ROPE_MISMATCH, codes.ROPE_DIFFERS} if any(c.kind == "rope" for c in served) else set()
    return sorted({f["code"] for f in report.get("findings", [])
                   if f.get("severity") in ("error", "warning") and f["code"] not in tested})


def _set(holder: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        nxt = holder.get(key)
        if not isinstance(nxt, dict):
            nxt = holder[key] = {}
        holder = nxt
    holder[keys[-1]] = value


def apply(config: dict[str, Any], candidate: Candidate, method: str | None) -> dict[str, Any]:
    """A copy of the drafter's ``config`` with ``candidate``'s change (the input is never modified)."""
    out = copy.deepcopy(config)
    layer = layer_config(out)
    for path, value in candidate.patch.items():
        if path == "taps":
            _write_taps(out, list(value), method)
        elif path == "rope_theta":
            params = layer.get("rope_parameters")
            if isinstance(params, dict):
                params["rope_theta"] = value
            if "rope_theta" in layer or not isinstance(params, dict):
                layer["rope_theta"] = value
        elif path.startswith("layer."):
            _set(layer, path[len("layer."):], value)
        else:
            _set(out, path, value)
    return out


def _write_taps(config: dict[str, Any], ids: list[int], method: str | None) -> None:
    """vLLM ids where this checkpoint format's reader takes them verbatim."""
    if is_speculators(config):
        # vLLM's updaters: update_eagle3 keeps eagle_aux_hidden_state_layer_ids, update_dflash maps
        # aux_hidden_state_layer_ids to eagle_aux_hidden_state_layer_ids (and target_layer_ids = ids - 1)
        key = next((k for k in ("aux_hidden_state_layer_ids", "eagle_aux_hidden_state_layer_ids") if k in config), None)
        if key is None:
            key = "aux_hidden_state_layer_ids" if method == "dflash" else "eagle_aux_hidden_state_layer_ids"
        config[key] = ids
        return
    # both runners read a top-level eagle_aux_hidden_state_layer_ids first, verbatim; DFlash's own field kept in step
    config["eagle_aux_hidden_state_layer_ids"] = ids
    dflash = config.get("dflash_config")
    if isinstance(dflash, dict) and "target_layer_ids" in dflash:
        dflash["target_layer_ids"] = [i - 1 for i in ids]
