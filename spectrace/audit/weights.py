"""Drafter weights: the parameters no checkpoint tensor reached, and the tensors nothing loaded.

A drafter parameter no tensor reaches keeps its initial value (``torch.empty``: whatever memory
held) and drafts garbage: 0 % acceptance or a mean length pinned at 1.00 (vllm#35548, #37667,
#47091, #49552, #43455). vLLM 0.32's strict "weights were not initialized" check
(``DefaultModelLoader.track_weights_loading``) is skipped for quantized models, for every
drafter whose ``load_weights`` returns nothing (EAGLE3, DFlash, EAGLE), and even when it runs it
counts every parameter of a layer with a ``quant_method`` (linear layers, embeddings) as loaded.
The loaded names come from vLLM itself (the set ``AutoWeightsLoader.load_weights`` returns);
the checkpoint's from its safetensors headers (``spectrace.vllm_objects.weights``).
"""

from __future__ import annotations

from typing import Any, Iterable

from spectrace.audit import codes
from spectrace.audit.findings import Finding

SHOWN = 20  # names listed in a finding's evidence (the counts are complete)
# checkpoint names vLLM folds into one fused parameter
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}
# checkpoint tensors vLLM consumes without a parameter of that name, or skips by design
_RENAMED = {"d2t": "draft_id_to_target_id"}  # EAGLE3's draft -> target vocabulary map
_NOT_PARAMETERS = ("t2d", "mask_hidden", "rotary_emb.inv_freq")  # skipped, or loaded into a buffer


def _leaf(name: str) -> tuple[str, str]:
    """(module, parameter) of a tensor or parameter name, fused names folded: the coarse key two
    namings of one weight share (``midlayer.self_attn.q_proj.weight`` ~ ``model.layers.2.self_attn.qkv_proj.weight``)."""
    parts = name.split(".")
    module = parts[-2] if len(parts) > 1 else ""
    leaf = _RENAMED.get(parts[-1], parts[-1])
    return _FUSED.get(module, module), leaf


def _shared_prefixes(shared: dict[str, str | None] | None) -> tuple[str, ...]:
    """Parameter-name pieces of the drafter's modules replaced by the target's (nothing to load)."""
    return tuple(f"{module}." for module, source in (shared or {}).items() if source == "target")


def unloaded_parameters(
    parameters: Iterable[str], loaded: set[str], shared: dict[str, str | None] | None = None, inert: Iterable[str] = ()
) -> list[str]:
    """Parameters nothing loaded, less those the target's modules replaced and those the model never reads."""
    pieces = _shared_prefixes(shared)
    skip = set(inert)
    return sorted(
        p for p in parameters
        if p not in loaded and p not in skip and not any(piece in f".{p}" or p.startswith(piece) for piece in pieces)
    )


def unused_tensors(tensors: Iterable[str], loaded: set[str]) -> list[str]:
    """Checkpoint tensors whose (module, parameter) no loaded parameter has: nothing consumed them."""
    keys = {_leaf(name) for name in loaded}
    leaves = {key[1] for key in keys}
    return sorted(
        t for t in tensors
        if not any(piece in t for piece in _NOT_PARAMETERS)
        and _leaf(t) not in keys
        and not ("." not in t and _leaf(t)[1] in leaves)  # a top-level tensor named like its parameter
    )


def audit_weights(
    role: str,
    *,
    tensors: dict[str, Any] | None,
    parameters: list[str] | None,
    loaded: set[str] | None,
    shared: dict[str, str | None] | None = None,
    quantization: str | None = None,
    inert: Iterable[str] = (),
) -> list[Finding]:
    """``DRAFT_WEIGHTS_UNLOADED`` and ``DRAFT_TENSORS_UNUSED`` for the drafter.

    ``tensors``: the checkpoint's tensor names (manifest); ``parameters``: the built drafter's
    parameter names; ``loaded``: the names vLLM's loader says it filled (None: not known, no
    judgement); ``shared``: ``{"embed_tokens": "own"|"target", "lm_head": ...}``; ``inert``: parameters the
    model never reads in its configuration (``spectrace.vllm_objects.weights.inert_parameters``).
    """
    if role != "draft" or loaded is None or parameters is None:
        return []
    findings: list[Finding] = []
    # vLLM zero-initialises EAGLE-3's draft_id_to_target_id (no uninitialised memory): a missing d2t maps draft
    # ids onto the first target tokens, which the vocabulary-map audit (audit.vocab, reading d2t) names
    missing = [p for p in unloaded_parameters(parameters, loaded, shared, inert)
               if p.rsplit(".", 1)[-1] != "draft_id_to_target_id"]
    unused = unused_tensors(tensors, loaded) if tensors else []
    base = {"quantization": quantization, "parameters": len(parameters), "loaded": len(loaded),
            "checkpoint_tensors": len(tensors) if tensors is not None else None, "shared_with_target": shared or {}}
    if missing:
        suspects = {p: [t for t in unused if _leaf(t)[1] == p.rsplit(".", 1)[-1]][:3] for p in missing[:SHOWN]}
        findings.append(
            codes.finding(
                codes.DRAFT_WEIGHTS_UNLOADED,
                severity="error",
                model_role=role,
                message=f"{len(missing)} of the drafter's {len(parameters)} parameters received no checkpoint tensor and "
                f"run with their initial values (uninitialised memory): {', '.join(missing[:5])}"
                + (" …" if len(missing) > 5 else "")
                + (f"; vLLM's own check is off for quantized models ({quantization})" if quantization else ""),
                evidence={**base, "unloaded_count": len(missing), "unloaded": missing[:SHOWN],
                          "unused_tensors_like_them": {k: v for k, v in suspects.items() if v}},
                fix="the drafter checkpoint lacks or mis-names these tensors: convert it again for this vLLM "
                "(the names its load_weights expects), or use a checkpoint that has them",
            )
        )
    if unused:
        findings.append(
            codes.finding(
                codes.DRAFT_TENSORS_UNUSED,
                severity="info" if missing else "warning",
                model_role=role,
                message=f"{len(unused)} of the drafter checkpoint's {len(tensors)} tensors match no parameter vLLM "
                f"loaded: {', '.join(unused[:5])}" + (" …" if len(unused) > 5 else ""),
                evidence={**base, "unused_count": len(unused), "unused": unused[:SHOWN]},
                fix="check the tensor names against the drafter class vLLM builds (mis-named or skipped tensors "
                "leave parameters at their initial values)",
                caused_by=codes.DRAFT_WEIGHTS_UNLOADED if missing else None,
            )
        )
    return findings


def head_tensor(tensors: dict[str, Any] | None) -> tuple[str, tuple[int, ...]] | None:
    """The drafter checkpoint's own head, ``(name, shape)``: a top-level ``lm_head.weight`` (what vLLM's drafters
    load into ``lm_head``; MTP's per-layer ``shared_head.head`` is the target's by design)."""
    for name, entry in (tensors or {}).items():
        if name.split(".")[-2:] == ["lm_head", "weight"] and not name.startswith("model.layers."):
            shape = entry[1] if isinstance(entry, tuple) and len(entry) == 2 else None
            return name, tuple(shape) if shape is not None else ()
    return None


def target_head_shape(tensors: dict[str, Any] | None) -> tuple[int, ...] | None:
    """The target checkpoint's head shape: its ``lm_head.weight``, else its input embedding (tied)."""
    named = {name: entry[1] for name, entry in (tensors or {}).items() if isinstance(entry, tuple) and len(entry) == 2}
    for name in ("lm_head.weight", "language_model.lm_head.weight", "model.embed_tokens.weight",
                 "model.language_model.embed_tokens.weight", "embed_tokens.weight"):
        if name in named:
            return tuple(named[name])
    return None


def _dims(shape: tuple[int, ...] | None) -> str:
    return " × ".join(map(str, shape)) if shape else "?"


def audit_head(
    role: str,
    *,
    tensors: dict[str, Any] | None,
    shared: dict[str, str | None] | None,
    has_own_lm_head: bool | None,
    target_shape: tuple[int, ...] | None,
) -> list[Finding]:
    """``DRAFT_HEAD_REPLACED``: a head in the drafter's checkpoint, and the target's ``lm_head`` module in the loaded
    drafter (vllm-ascend#11374).

    vLLM 0.32 shares the target's head when the drafter has none or when the two are equal: V1's
    ``_maybe_share_lm_head`` and V2's ``_should_share`` compare them (``torch.equal``) once the drafter's
    ``load_weights`` flagged ``has_own_lm_head``. So a shared head of the same shape with the flag set is a copy
    (quiet); one of another shape cannot be (error); one of the same shape shared with the flag unset was never
    compared (warning). ``tensors``: the drafter's own checkpoint (None: in the target's, as MTP, or unread).
    """
    if role != "draft" or (shared or {}).get("lm_head") != "target":
        return []
    head = head_tensor(tensors)
    if head is None:
        return []
    name, shape = head
    evidence = {"tensor": name, "draft_shape": list(shape), "target_shape": list(target_shape) if target_shape else None,
                "has_own_lm_head": has_own_lm_head, "shared_with_target": dict(shared or {})}

    if target_shape is not None and shape and tuple(shape) != tuple(target_shape):
        return [codes.finding(
            codes.DRAFT_HEAD_REPLACED, severity="error", model_role=role,
            message=f"the drafter's checkpoint ships a head of its own ({name}, {_dims(shape)}) but the loaded drafter "
            f"computes its logits with the target's lm_head ({_dims(target_shape)}): the head it was trained with is "
            "unused and its drafts come from a head it never learnt (vllm-ascend#11374: 25 % acceptance fell to 1.7 %)",
            evidence=evidence,
        )]
    if has_own_lm_head:
        return []  # vLLM compared the two and found them equal: a copy, shared to save memory
    return [codes.finding(
        codes.DRAFT_HEAD_REPLACED, severity="warning", model_role=role,
        message=f"the drafter's checkpoint ships a head of its own ({name}, {_dims(shape)}) and the loaded drafter uses "
        "the target's lm_head instead, without vLLM comparing the two (the drafter class never flagged its own head): "
        "if the checkpoint's head differs from the target's, its drafts come from a head it was not trained with",
        evidence=evidence,
        fix="compare the drafter's lm_head.weight with the target's: if they differ, the drafter needs a vLLM build "
        "that keeps its own head",
    )]
