"""Every drafter field: what its ``config.json`` declared against what vLLM builds the drafter from (issue #35).

The stages a declared field passes through are vLLM's own code, run by the caller
(``spectrace.vllm_objects.configs.drafter_stages``: for a speculators-format checkpoint
``SpeculatorsConfig.extract_transformers_pre_trained_config`` and its algorithm updater,
then ``SpeculatorsConfig`` itself; for a Hugging Face one the transformers config class;
then ``SpeculativeConfig.__post_init__``), so nothing here copies a rule of vLLM's. This module
only compares: each declared field (top level, ``transformer_layer_config``, ``eagle_config``,
``dflash_config``, ``rope_parameters`` / ``rope_scaling``) is followed through the stages, and
the first stage that lost or changed it is named.

- ``DRAFT_FIELD_DROPPED`` / ``DRAFT_FIELD_CHANGED``: declared, then absent / another value;
- ``DRAFT_FIELD_OVERRIDDEN``: declared inside ``transformer_layer_config`` and overwritten by the
  updater's top-level default (vLLM reads ``norm_before_fc``, ``fc_norm``, ``norm_output`` and
  ``norm_before_residual`` from the top level only: vllm#38111, #46488);
- ``DRAFT_FIELD_DEFAULT_DIFFERS``: not declared, and vLLM's default differs from the trainer's
  (speculators writes its configs with ``to_diff_dict()``, so its own defaults are absent).

A field whose change is already a finding (``SWA_DROPPED``'s fields, the RoPE findings, the tap
findings, the attention fields of ``FIELD_DROPPED`` / ``FIELD_CHANGED``) is linked to it
(``caused_by``) or left to it, never reported twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from spectrace.audit import codes
from spectrace.config_dicts import _BOOKKEEPING, _MISSING, _get
from spectrace.audit.findings import Finding
from spectrace.readings import Stage, is_speculators  # noqa: F401  (audit.fields.Stage: the name judges use)

# Keys of a speculators-format config that describe the checkpoint, not the drafter's arithmetic:
# vLLM reads them itself (the method, the verifier, k) or they are the format's own bookkeeping.
SPECULATORS_STRUCTURE = frozenset({
    "speculators_config", "speculators_model_type", "speculators_version", "transformer_layer_config",
    "auto_map", "has_no_defaults_at_init", "model_type",
})
# model_type names the config class (vLLM rewrites it to "eagle" / "speculators" when it wraps the drafter)
# Keys of a speculators-format config that only the trainer reads (vllm-project/speculators, the config classes in
# src/speculators/models/*/config.py): whether the embeddings were trained (Eagle3SpeculatorConfig
# ``embed_requires_grad``), training's sequence parallelism (``enable_sp_ulysses``), DFlash's loss schedule and loss
# mask (DFlashSpeculatorConfig ``lambda_base_start``, ``lambda_base_decay_ratio``, ``auf``). Serving never reads
# them, so vLLM dropping them changes nothing: they are not followed.
TRAINING_ONLY = frozenset({"embed_requires_grad", "enable_sp_ulysses", "lambda_base_start", "lambda_base_decay_ratio", "auf"})
NESTED = ("eagle_config", "dflash_config", "rope_parameters", "rope_scaling")

# The trainers' own defaults for fields their serialisers leave out. speculators'
# ``Eagle3SpeculatorConfig`` (vllm-project/speculators, src/speculators/models/eagle3/config.py):
# ``norm_before_residual: bool = False``; its ``norm_before_fc`` / ``fc_norm`` / ``norm_output`` default
# False where it has them. A field vLLM defaults to the same value never fires.
TRAINER_DEFAULTS: dict[str, dict[str, Any]] = {
    "eagle3": {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False},
    "peagle": {"norm_before_residual": False, "norm_before_fc": False},
}
TRAINER_SOURCE = "speculators Eagle3SpeculatorConfig (src/speculators/models/eagle3/config.py), written with to_diff_dict()"

# Fields that change what the drafter computes: a change is an error. Anything else (metadata,
# token ids, initialisers) is a warning.
_COMPUTE = frozenset({
    "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "rms_norm_eps", "hidden_act",
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "num_hidden_layers", "attention_bias", "mlp_bias", "draft_vocab_size", "target_hidden_size", "vocab_size",
    "eagle_aux_hidden_state_layer_ids", "target_layer_ids", "num_aux_hidden_states", "use_aux_hidden_state",
    "logit_scale", "tie_word_embeddings", "sliding_window", "use_sliding_window", "layer_types",
    "max_window_layers", "partial_rotary_factor", "qk_norm", "block_size", "mask_token_id", "causal",
    "swa_window_size", "use_swa", "layer_ids", "conv_kernel_size", "conv_group_size", "selector_rank",
    "selector_top_k",
})
_SWA = frozenset({"sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "swa_window_size", "use_swa"})
_TAPS = frozenset({"eagle_aux_hidden_state_layer_ids", "target_layer_ids", "layer_ids"})
# Fields a method's vLLM model never reads, wherever they are declared: neither lost nor to be moved. DFlash drafts
# num_speculative_tokens per step; block_size is read only for DSpark (vllm/config/speculative.py: the DSpark
# branch of SpeculativeConfig.__post_init__ and _get_qwen3_dspark_value; speculators/algos.py: update_dspark keeps
# it, update_dflash does not). The trainer writes it to say how many positions the drafter learnt (speculators
# DFlashDraftModel._build_base_config_kwargs: speculative_tokens = block_size - 1 without sample_from_anchor).
NOT_READ = {
    "dflash": {
        "block_size": "vLLM's DFlash does not read it (only DSpark's does): it drafts num_speculative_tokens per "
        "step; it is the block the drafter was trained with, so a k above block_size - 1 drafts positions it never "
        "learnt",
    },
}
# vLLM raises an EAGLE drafter's max_position_embeddings to the target's context on purpose (#48894)
_INTENDED = frozenset({"max_position_embeddings"})


@dataclass
class DrafterField:
    path: str  # where config.json declares it (``transformer_layer_config.norm_before_fc``)
    key: str  # where vLLM's config holds it (``norm_before_fc``)
    declared: Any
    resolved: Any
    status: str  # ok | moved | dropped | changed | overridden | default_differs
    rule: str | None  # the vLLM function that made the change

    def as_row(self, role: str = "draft") -> dict[str, Any]:
        """A ``config_fields`` row (``FieldDiff.as_row``'s columns)."""
        return {
            "model_role": role,
            "field": self.path,
            "declared": json.dumps(self.declared, default=str),
            "resolved": json.dumps(self.resolved, default=str),
            "status": self.status,
        }


def _method(declared: dict[str, Any] | None) -> str | None:
    """The drafter's method as its config names it: the speculators type, else the architecture's."""
    if not isinstance(declared, dict):
        return None
    kind = declared.get("speculators_model_type")
    if isinstance(kind, str):
        return kind
    from spectrace.audit.pair import architecture_method

    return architecture_method(declared)


def _leaves(declared: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(path in config.json, key in vLLM's config, value) of every declared field."""
    sources: list[tuple[str, dict[str, Any]]] = [("", declared)]
    speculators = is_speculators(declared)
    layer = declared.get("transformer_layer_config")
    if speculators and isinstance(layer, dict):
        sources.append(("transformer_layer_config.", layer))
    for prefix, source in sources:
        for key, value in source.items():
            if key in _BOOKKEEPING or key == "model_type" or (speculators and key in SPECULATORS_STRUCTURE | TRAINING_ONLY):
                continue
            if key in NESTED and isinstance(value, dict) and value:
                for sub, sub_value in value.items():
                    yield f"{prefix}{key}.{sub}", f"{key}.{sub}", sub_value
            else:
                yield f"{prefix}{key}", key, value


def _lookup(config: dict[str, Any] | None, key: str) -> Any:
    """``key`` in a resolved config; transformers 5 keeps rope_scaling's keys and rope_theta in rope_parameters."""
    value = _get(config, key)
    if value is _MISSING and key.startswith("rope_scaling."):
        value = _get(config, "rope_parameters." + key.split(".", 1)[1])
    if value is _MISSING and key == "rope_theta":
        value = _get(config, "rope_parameters.rope_theta")
    return value


def _norm(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _same(declared: Any, resolved: Any) -> bool:
    if resolved is _MISSING:
        return declared is None  # a declared null that vanished is no change
    if declared is None and isinstance(resolved, dict) and resolved.get("rope_type", "default") == "default":
        return True  # "rope_scaling": null is the default rope type
    return _norm(declared) == _norm(resolved)


def _leaf_name(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def drafter_fields(declared: dict[str, Any] | None, stages: list[Stage]) -> list[DrafterField]:
    """Each declared field followed through vLLM's stages, and each trainer default vLLM replaced.

    For a Hugging Face-format drafter the first stage is transformers' config class: what it converts
    (``sliding_window_pattern`` into ``layer_types``, ``rope_scaling`` into ``rope_parameters``) is the config
    audit's (``resolution.audit_config``, the layout), so only vLLM's own later stages are followed here."""
    if not isinstance(declared, dict) or not stages or stages[-1].config is None:
        return []
    final = stages[-1].config
    speculators = is_speculators(declared)
    fields: list[DrafterField] = []
    top = declared
    for path, key, value in _leaves(declared):
        moved = _moved(path, value, stages)
        if moved is not None:
            fields.append(moved)
            continue
        resolved = _lookup(final, key)
        rule = None
        for stage in stages:
            if stage.config is None:
                break
            if not _same(value, _lookup(stage.config, key)):
                rule = stage.rule
                break
        if not speculators and rule == stages[0].rule:
            continue  # transformers' own conversion: the config audit's (FIELD_*, SWA_DROPPED, layer_types, layout)
        if _same(value, resolved):
            status = "ok"
        elif resolved is _MISSING:
            status = "dropped"
        elif path.startswith("transformer_layer_config.") and key not in top and rule == stages[0].rule:
            status = "overridden"
        else:
            status = "changed"
        fields.append(DrafterField(path, key, value, None if resolved is _MISSING else resolved, status, rule))
    kind = declared.get("speculators_model_type")
    layer = declared.get("transformer_layer_config")
    for key, default in TRAINER_DEFAULTS.get(kind, {}).items() if speculators else ():
        if key in declared or (isinstance(layer, dict) and key in layer):
            continue
        resolved = _lookup(final, key)
        if resolved is _MISSING or _same(default, resolved):
            continue
        rule = next((s.rule for s in stages if s.config is not None and _lookup(s.config, key) is not _MISSING), None)
        fields.append(DrafterField(key, key, None, resolved, "default_differs", rule))
    return fields


def _moved(path: str, declared: Any, stages: list[Stage]) -> DrafterField | None:
    """A top-level field the first stage (vLLM's speculators updater) moved to other keys, followed from there:
    ``moved`` while every key it went to keeps the updater's value to the end, else ``dropped`` / ``changed`` by
    the later stage that lost or changed it; None for a field no stage moved."""
    first = stages[0]
    targets = (first.moves or {}).get(path)
    if not targets or first.config is None:
        return None
    placed = {target: _lookup(first.config, target) for target in targets}
    for stage in stages[1:]:
        if stage.config is None:
            break
        now = {target: _lookup(stage.config, target) for target in targets}
        lost = [t for t in targets if now[t] is _MISSING and placed[t] is not _MISSING]
        changed = [t for t in targets if t not in lost and _norm(now[t]) != _norm(placed[t])]
        if lost or changed:
            status = "dropped" if lost and len(lost) == len(targets) else "changed"
            resolved = {t: (None if now[t] is _MISSING else now[t]) for t in targets}
            return DrafterField(path, ", ".join(targets), declared, resolved, status, stage.rule)
    final = {target: (None if placed[target] is _MISSING else placed[target]) for target in targets}
    return DrafterField(path, ", ".join(targets), declared, final, "moved", first.rule)


# the fields vLLM's EAGLE-3 updater reads from the top level of a speculators-format config, and only there
_TOP_LEVEL_READ = frozenset({"norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "draft_vocab_size",
                             "target_hidden_size", "eagle_aux_hidden_state_layer_ids"})


def _fix(field: DrafterField, speculators: bool) -> str:
    value = json.dumps(field.declared if field.status != "default_differs" else _trainer_default(field), default=str)
    if speculators and field.key in _TOP_LEVEL_READ:
        return f'declare "{field.key}": {value} at the top level of config.json (vLLM reads it only there)'
    if speculators and not field.path.startswith("transformer_layer_config."):
        return (f"move {field.path} = {value} into transformer_layer_config: vLLM builds the drafter from that object "
                "and reads only the EAGLE-3 fields from the top level")
    return f"declare {field.path} = {value} where this vLLM reads it ({field.rule} changes it)"


def _trainer_default(field: DrafterField) -> Any:
    for defaults in TRAINER_DEFAULTS.values():
        if field.key in defaults:
            return defaults[field.key]
    return None


def field_findings(
    declared: dict[str, Any] | None,
    fields: Iterable[DrafterField],
    *,
    covered: set[str] = frozenset(),
    causes: Iterable[Finding] = (),
    role: str = "draft",
) -> list[Finding]:
    """One finding per lost, changed, overridden or replaced drafter field.

    ``covered``: paths an existing finding already reports (``FIELD_DROPPED`` / ``FIELD_CHANGED``);
    ``causes``: the run's other findings, for ``caused_by`` links (SWA, RoPE, taps).
    """
    speculators = is_speculators(declared)
    present = {f.code: f for f in causes if f.model_role == role and f.caused_by is None}
    rope = next((c for c in (codes.ROPE_MISMATCH, codes.ROPE_DIFFERS) if c in present), None)
    tap = next((c for c in (codes.TAP_CONVENTION, codes.TAP_MISMATCH, codes.TAP_OUT_OF_RANGE, codes.TAP_COUNT_MISMATCH,
                            codes.TAP_DEFAULTED) if c in present
                and not (c == codes.TAP_CONVENTION and present[c].severity == "info")), None)
    findings = []
    for field in fields:
        if field.status in ("ok", "moved") or any(field.path == c or field.path.startswith(f"{c}.") for c in covered):
            continue
        name = _leaf_name(field.key)
        code = {
            "dropped": codes.DRAFT_FIELD_DROPPED,
            "changed": codes.DRAFT_FIELD_CHANGED,
            "overridden": codes.DRAFT_FIELD_OVERRIDDEN,
            "default_differs": codes.DRAFT_FIELD_DEFAULT_DIFFERS,
        }[field.status]
        caused = None
        if name in _SWA and codes.SWA_DROPPED in present:
            caused = codes.SWA_DROPPED
        elif field.key.startswith(("rope_", "partial_rotary")) and rope:
            caused = rope
        elif name in _TAPS and tap:
            caused = tap
        intended = name in _INTENDED and field.rule is not None and "SpeculativeConfig" in field.rule
        unread = NOT_READ.get(_method(declared), {}).get(name) if field.status == "dropped" else None
        if caused or intended or unread:
            severity = "info"
        elif name in _COMPUTE or field.key.startswith(("rope_", "eagle_config.", "dflash_config.")):
            severity = "error"
        else:
            severity = "warning"
        if field.status == "default_differs":
            message = (f"{role} {field.path}: not declared, so vLLM uses {json.dumps(field.resolved)} "
                       f"where the trainer's default is {json.dumps(_trainer_default(field))} "
                       f"({TRAINER_SOURCE}); set by {field.rule}")
        elif field.status == "overridden":
            message = (f"{role} {field.path} = {json.dumps(field.declared, default=str)} is overwritten by the top-level "
                       f"default {json.dumps(field.resolved, default=str)}: {field.rule} reads {name} from the top level only")
        elif field.status == "dropped":
            message = (f"{role} {field.path} = {json.dumps(field.declared, default=str)} is declared but absent from the "
                       f"config vLLM builds the drafter from (dropped by {field.rule})")
        else:
            message = (f"{role} {field.path}: declared {json.dumps(field.declared, default=str)}, vLLM builds the drafter "
                       f"with {json.dumps(field.resolved, default=str)} (changed by {field.rule})")
        if unread:
            message = f"{role} {field.path} = {json.dumps(field.declared, default=str)}: {unread}"
        if intended:
            message += "; vLLM raises it to the target's context on purpose (EAGLE drafts share the target's positions)"
        findings.append(
            codes.finding(
                code,
                severity,
                model_role=role,
                message=message,
                evidence={
                    "field": field.path,
                    "resolved_as": field.key,
                    "declared": field.declared,
                    "resolved": field.resolved,
                    "vllm_rule": field.rule,
                    "format": "speculators" if speculators else "hf",
                    **({"trainer_default": _trainer_default(field), "trainer": TRAINER_SOURCE}
                       if field.status == "default_differs" else {}),
                },
                fix="" if caused or intended or unread else _fix(field, speculators),
                caused_by=caused,
            )
        )
    return findings


# checkpoint tensors a drafter trained with a norm carries, by the field that makes vLLM build the norm
_NORM_TENSORS = {"norm_before_fc": "input_norm.", "fc_norm": "fc_norm."}


def relink(findings: list[Finding]) -> None:
    """Link findings that arrived after the judge (doctor's meta build) to the field findings that explain
    them or that they explain: the norm tensors nothing loaded because vLLM lost the norm's field
    (``DRAFT_TENSORS_UNUSED``), and field findings about the taps next to the tap findings."""
    lost = {f.evidence.get("resolved_as"): f.code for f in findings
            if f.code in FIELD_CODES and f.caused_by is None and f.evidence.get("resolved") in (False, None)}
    for finding in findings:
        if finding.code != codes.DRAFT_TENSORS_UNUSED or finding.caused_by is not None:
            continue
        unused = finding.evidence.get("unused") or []
        names = [name for name in _NORM_TENSORS if name in lost]
        if names and unused and all(any(_NORM_TENSORS[name] in t for name in names) for t in unused):
            finding.caused_by, finding.severity, finding.fix = lost[names[0]], "info", ""
            finding.message += f" (vLLM built no {' / '.join(names)} norm: see {lost[names[0]]})"
    # a convention that cannot be told (TAP_CONVENTION info) explains no lost field
    taps = {f.code for f in findings if f.component == "taps" and f.caused_by is None and f.model_role == "draft"
            and not (f.code == codes.TAP_CONVENTION and f.severity == "info")}
    tap = next((c for c in (codes.TAP_CONVENTION, codes.TAP_MISMATCH, codes.TAP_OUT_OF_RANGE, codes.TAP_COUNT_MISMATCH,
                            codes.TAP_DEFAULTED) if c in taps), None)
    if tap is None:
        return
    for finding in findings:
        if finding.code in FIELD_CODES and finding.caused_by is None and _leaf_name(finding.evidence.get("resolved_as", "")) in _TAPS:
            finding.caused_by, finding.severity, finding.fix = tap, "info", ""


FIELD_CODES = (codes.DRAFT_FIELD_DROPPED, codes.DRAFT_FIELD_CHANGED, codes.DRAFT_FIELD_OVERRIDDEN,
               codes.DRAFT_FIELD_DEFAULT_DIFFERS)
