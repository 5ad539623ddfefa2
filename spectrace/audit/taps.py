"""Hidden-state taps: which target layers the drafter was trained on vs which ones vLLM taps."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from spectrace.audit import codes
from spectrace.config_dicts import _get
from spectrace.audit.findings import Finding
from spectrace.console import bounded, listed


# -- hidden-state taps -----------------------------------------------------------------

# The layer ids the common EAGLE-3 trainers tap when none are given, in vLLM's convention: speculators
# (src/speculators/models/utils.py resolve_target_layer_ids: [2, N // 2, N - 3]), SpecForge
# (specforge/algorithms/model_providers.py: capture layers [1, N // 2 - 1, N - 4] in SGLang's convention, the
# output of layer i, which is vLLM's id i + 1) and the EAGLE-3 reference (SafeAILab/EAGLE eagle/model/modeling_llama_kv.py:
# the input of layers 2, N // 2 and N - 3); vLLM's own fallback heuristic is the same.
TRAINERS_DEFAULT_SOURCE = ("that is what speculators, SpecForge (in SGLang's convention) and the EAGLE-3 reference "
                           "train with when given no ids")


def trainers_default(target_layers: Any) -> list[int] | None:
    """(2, N // 2, N - 3) for a target of N layers: the taps the common trainers use by default."""
    if not isinstance(target_layers, int) or isinstance(target_layers, bool) or target_layers < 6:
        return None
    return sorted({2, target_layers // 2, target_layers - 3})
#
# vLLM's tap id k is the hidden state after target layer k-1 (id 0: the embeddings);
# HF's ``hidden_states[k]``. EAGLE3 checkpoints declare ids in that convention. DFlash
# (and DSpark, and speculators' ``target_layer_ids``) declare target layer ids, and the
# DFlash reference (z-lab/dflash ``extract_context_feature``) reads
# ``hidden_states[layer_id + 1]``: the vLLM id is the declared id + 1.

# (field, convention offset): where drafters declare their taps and how each field's ids
# map to vLLM ids, roughly in the order vLLM 0.32's resolvers look (V2:
# v1/worker/gpu/spec_decode/eagle/eagle3_utils.py::get_eagle3_aux_layers_from_config;
# V1: GPUModelRunner._get_eagle3_aux_layers_from_config, which also reads the nested
# eagle_config ids and ignores the top-level and *.layer_ids fields). Which ids a
# runner really taps is read from the loaded model (live) or from the runner's own
# function (doctor), never from this table.
TAP_FIELDS: tuple[tuple[str, int], ...] = (
    ("eagle_aux_hidden_state_layer_ids", 0),
    ("eagle_config.eagle_aux_hidden_state_layer_ids", 0),
    ("dflash_config.target_layer_ids", 1),
    ("dspark_target_layer_ids", 1),
    ("target_layer_ids", 1),
    ("dflash_config.layer_ids", 0),
    ("eagle_config.layer_ids", 0),
)


# -- who trained the drafter, and the convention its declared ids are in ---------------------------------------
#
# vLLM reads each tap field in one convention (TAP_FIELDS' offset). The trainer wrote its ids in its own, told from
# what the checkpoint carries:
# - speculators (``speculators_config`` / ``speculators_model_type``): it extracts the target's hidden states with
#   vLLM itself, so its ids are vLLM tap ids by construction;
# - SpecForge (``eagle_config.eagle_aux_hidden_state_layer_ids``: specforge/algorithms/model_providers.py
#   resolve_eagle_capture_layers reads the ids there): it captures through SGLang, whose
#   ``set_eagle3_layers_to_capture`` adds 1 (id L is the output of decoder layer L, HF hidden_states[L + 1]; its
#   own capture test: "capture layer id L (sglang convention) == hidden_states[L+1]"); vLLM's tap k is the input of
#   layer k (hidden_states[k]), and V1 reads the nested ids verbatim: one layer early on every tap (vllm#43671);
# - the DFlash reference layout (``dflash_config.target_layer_ids``, z-lab/dflash and SpecForge's DFlash): layer
#   ids, hidden_states[id + 1], the convention vLLM reads them in (+1).
# Top-level ``eagle_aux_hidden_state_layer_ids`` without speculators' config: vLLM's own field, but who wrote it
# cannot be told from the checkpoint (the probe measures it).
SPECULATORS, SPECFORGE, DFLASH_REFERENCE = "speculators", "specforge", "dflash-reference"
PRODUCER_SOURCES = {
    SPECULATORS: "speculators_config: speculators extracts the target's hidden states with vLLM itself, so its ids "
                 "are vLLM tap ids",
    SPECFORGE: "eagle_config.eagle_aux_hidden_state_layer_ids: SpecForge's layout (specforge/algorithms/"
               "model_providers.py resolve_eagle_capture_layers), captured through SGLang, whose "
               "set_eagle3_layers_to_capture adds 1: id L is the output of decoder layer L",
    DFLASH_REFERENCE: "dflash_config.target_layer_ids: the DFlash reference's layout (z-lab/dflash "
                      "extract_context_feature, SpecForge's DFlash): hidden_states[id + 1]",
}
# (producer, field) -> the offset from the declared ids to the vLLM ids the drafter was trained on, where it is
# not the offset vLLM reads the field with
TRAINED_OFFSET = {(SPECFORGE, "eagle_config.eagle_aux_hidden_state_layer_ids"): 1}
# what each convention calls a tap id (for the messages)
VLLM_CONVENTION = "vLLM's convention: tap k is the input of decoder layer k, hidden_states[k]"
SGLANG_CONVENTION = "SGLang's convention: id L is the output of decoder layer L, hidden_states[L + 1]"


def tap_producer(draft: dict[str, Any] | None) -> str | None:
    """Who trained the drafter, told from what its checkpoint carries (None: it cannot be told)."""
    if not isinstance(draft, dict):
        return None
    # declared, or as vLLM resolved it (SpeculatorsConfig: model_type "speculators")
    if "speculators_config" in draft or "speculators_model_type" in draft or draft.get("model_type") == "speculators":
        return SPECULATORS
    eagle_config = draft.get("eagle_config")
    if isinstance(eagle_config, dict) and eagle_config.get("eagle_aux_hidden_state_layer_ids") is not None:
        return SPECFORGE
    if isinstance(draft.get("dflash_config"), dict):
        return DFLASH_REFERENCE
    return None


@dataclass
class TapAudit:
    declared_field: str | None
    declared_ids: list[int] | None
    expected_ids: list[int] | None
    tapped_ids: list[int] | None
    input_taps: int | None  # taps the drafter's input projection (fc) is sized for
    status: str  # ok | defaulted | mismatch | out_of_range | count_mismatch | unknown
    capture_point: str | None = None  # what tap k captures, from the target's model code (None: not recognised)

    def as_row(self) -> dict[str, Any]:
        """The hidden_state_taps row; id lists as evidence is (a config's million ids cut with a count)."""
        return {
            "declared_field": self.declared_field,
            "declared_ids": json.dumps(bounded(self.declared_ids)),
            "expected_ids": json.dumps(bounded(self.expected_ids)),
            "tapped_ids": json.dumps(bounded(self.tapped_ids)),
            "input_taps": self.input_taps,
            "status": self.status,
            "capture_point": self.capture_point,
        }


def _layer_id(value: Any) -> int | None:
    """``value`` as a layer id: an integer (or a float that is one); None for anything else (NaN, inf, text, null)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def declared_taps(draft: dict[str, Any] | None) -> tuple[str | None, list[int] | None, int]:
    """(field, ids, convention offset) the drafter declares its taps in, or (None, None, 0). A field holding
    anything but layer ids gives (field, None, offset): declared, not readable (``audit_taps`` says so)."""
    for field_name, offset in TAP_FIELDS:
        ids = _get(draft, field_name, None)
        if isinstance(ids, (list, tuple)) and ids:
            parsed = [_layer_id(i) for i in ids]
            return field_name, (None if None in parsed else parsed), offset
    return None, None, 0


def audit_taps(
    *,
    draft: dict[str, Any] | None,
    target_layers: int,
    tapped_ids: list[int] | None,
    input_taps: int | None,
    rule: str = "",
    default_ids: list[int] | None = None,
    default_rule: str | None = None,
    capture_point: str | None = None,
    capture_rule: str | None = None,
) -> tuple[TapAudit, list[Finding]]:
    """Which target layers the drafter was trained on vs which ones vLLM taps.

    ``tapped_ids``: what the loaded target really taps (live), or what vLLM's id
    resolution gives (doctor). ``input_taps``: how many taps the drafter's input
    projection takes. ``rule`` names the vLLM function behind ``tapped_ids``.
    ``default_ids`` / ``default_rule``: the target's fallback ids and the method giving them
    (``vllm_objects.taps.default_taps``): taps equal to them with no declared ids read are guessed.
    """
    field_name, declared, offset = declared_taps(draft)
    producer = tap_producer(draft)
    trained_offset = TRAINED_OFFSET.get((producer, field_name), offset)
    expected = sorted({i + trained_offset for i in declared}) if declared else None
    read_as = sorted({i + offset for i in declared}) if declared else None  # what vLLM makes of them, reading them
    tapped = sorted(set(tapped_ids)) if tapped_ids is not None else None
    guessed = tapped is not None and default_ids is not None and tapped == sorted(set(default_ids))
    findings: list[Finding] = []
    status = "ok"
    evidence = {
        "declared_field": field_name,
        "declared_ids": declared,
        "expected_ids": expected,
        "tapped_ids": tapped,
        "input_taps": input_taps,
        "target_layers": target_layers,
        "vllm_rule": rule,
        "guessed": guessed,
        "default_ids": default_ids,
        "default_rule": default_rule,
        "capture_point": capture_point,
        "capture_rule": capture_rule,
        "producer": producer,
        "producer_source": PRODUCER_SOURCES.get(producer),
    }
    if field_name is not None and declared is None:  # NaN, inf, text or null among the ids: none can be tapped
        status = "out_of_range"
        raw = _get(draft, field_name, None)
        findings.append(codes.finding(
            codes.TAP_OUT_OF_RANGE,
            severity="error",
            model_role="draft",
            message=f"{field_name} holds values that are not layer ids ({listed([repr(v) for v in raw if _layer_id(v) is None])}): "
            "the drafter's taps cannot be read",
            evidence=evidence,
        ))
    if expected is not None:
        outside = [i for i in expected if i < 0 or i > target_layers]
        if outside:
            status = "out_of_range"
            findings.append(
                codes.finding(
                    codes.TAP_OUT_OF_RANGE,
                    severity="error",
                    model_role="draft",
                    message=f"{field_name} = {listed(declared)} asks for hidden state(s) {listed(outside)}, but the target has "
                    f"{target_layers} layers (valid vLLM ids 0..{target_layers})",
                    evidence=evidence,
                )
            )
    if tapped is not None and input_taps is not None and len(tapped) != input_taps:
        status = "count_mismatch" if status == "ok" else status
        findings.append(
            codes.finding(
                codes.TAP_COUNT_MISMATCH,
                severity="error",
                model_role="draft",
                message=f"vLLM taps {len(tapped)} target layer(s) {listed(tapped)}, but the drafter's input projection "
                f"takes {input_taps}",
                evidence=evidence,
                fix="declare the drafter's layer ids in a field this vLLM reads (see evidence.declared_field)",
            )
        )
    if expected is None:
        status = "defaulted" if status == "ok" else status
        common = tapped is not None and tapped == trainers_default(target_layers)
        findings.append(
            codes.finding(
                codes.TAP_DEFAULTED,
                severity="info" if common else "warning",
                model_role="draft",
                message=f"vLLM guessed the drafter's taps {listed(tapped)}: the drafter declares no hidden-state layer ids "
                f"in any field vLLM reads ({', '.join(f for f, _ in TAP_FIELDS[:3])}, ...), so the model runner fell back to "
                + (f"{default_rule} (the (2, N//2, N-3) heuristic for {target_layers} target layers unless the model "
                   "overrides it)" if guessed and default_rule else "the target's default ids")
                + (f"; {TRAINERS_DEFAULT_SOURCE}, so this is right unless the drafter was trained on other layers "
                   "(vllm#50170's was): acceptance that collapses from the first request, or the trainer's recorded "
                   "layer ids, settles it" if common else
                   f"; they are not the common trainers' default {listed(trainers_default(target_layers))}, so a "
                   "drafter trained the usual way is fed other layers (vllm#50170)"),
                evidence={**evidence, "trainers_default": trainers_default(target_layers),
                          **({"settled_by": "the trainer's layer ids, or acceptance in a run"} if common else {})},
            )
        )
    convention = None
    if expected is not None and trained_offset != offset and status != "out_of_range":
        evidence.update(trained_convention=SGLANG_CONVENTION, read_convention=VLLM_CONVENTION, ids_to_declare=expected)
        if tapped == read_as:  # vLLM read the ids, in its own convention
            status = "mismatch" if status == "ok" else status
            convention = codes.finding(
                codes.TAP_CONVENTION,
                severity="error",
                model_role="draft",
                message=f"{field_name} = {listed(declared)} is in {SGLANG_CONVENTION} ({producer}: {PRODUCER_SOURCES[producer]}), "
                f"so the drafter was trained on vLLM taps {listed(expected)}; vLLM reads the ids verbatim in "
                f"{VLLM_CONVENTION}, and taps {listed(tapped)}: one layer early on every tap (vllm#43671), nothing fails "
                "and drafts are silently rejected",
                evidence=evidence,
                fix=f'declare "eagle_aux_hidden_state_layer_ids": {json.dumps(expected)} at the top level of config.json '
                "(vLLM tap ids, read verbatim by both model runners)",
            )
            findings.append(convention)
    elif (expected is not None and producer is None and field_name == "eagle_aux_hidden_state_layer_ids"
          and status == "ok" and tapped == expected):
        findings.append(codes.finding(
            codes.TAP_CONVENTION,
            severity="info",
            model_role="draft",
            message=f"{field_name} = {listed(declared)} is read as vLLM tap ids ({VLLM_CONVENTION}); who trained the "
            "drafter cannot be told from its checkpoint (no speculators_config, no SpecForge eagle_config), so neither "
            f"can the convention: a drafter trained through SGLang with these ids ({SGLANG_CONVENTION}) wants "
            f"{listed([i + 1 for i in expected])}",
            evidence={**evidence, "settled_by": "acceptance at position 0 in a run, or spectrace probe (it serves the ids "
                      "+ 1)", "sglang_reading": [i + 1 for i in expected]},
            fix="",
        ))
    if expected is not None and tapped is not None and tapped != expected and status not in ("out_of_range",):
        if status == "ok":
            status = "mismatch"
        same_count = len(tapped) == len(expected)
        caused = codes.TAP_COUNT_MISMATCH if not same_count and status == "count_mismatch" else None
        caused = caused or (codes.TAP_CONVENTION if convention is not None else None)
        findings.append(
            codes.finding(
                codes.TAP_MISMATCH,
                severity="info" if caused else "error",
                model_role="draft",
                message=f"the drafter was trained on hidden states {listed(expected)} ({field_name} = {listed(declared)}"
                + (f", +{trained_offset} for {SGLANG_CONVENTION}" if trained_offset != offset else
                   f", +{offset} for the reference convention" if offset else "")
                + f"), but vLLM taps {listed(tapped)}"
                + (f" — its guessed default ({default_rule}): {field_name} is not read by this model runner, so it fell "
                   "back as if nothing were declared" if guessed and default_rule else "")
                + (": same count, so nothing fails and drafts are silently rejected" if same_count else ""),
                evidence=evidence,
                fix="" if caused == codes.TAP_CONVENTION else
                (f'declare "eagle_aux_hidden_state_layer_ids": {json.dumps(expected)} at the top level of config.json '
                 "(vLLM tap ids, read verbatim by both model runners)" if trained_offset != offset else
                 "declare the ids in a field this vLLM reads for this model runner "
                 "(eagle_aux_hidden_state_layer_ids holds vLLM ids verbatim), or upgrade vLLM"),
                caused_by=caused,
            )
        )
    return TapAudit(field_name, declared, expected, tapped, input_taps, status, capture_point), findings
