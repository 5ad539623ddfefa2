"""The drafter's vocabulary map: ``d2t`` (and ``t2d``) of a drafter with a reduced vocabulary (issue #35).

vLLM 0.32's EAGLE-3 drafter (``llama_eagle3.py``) keeps ``draft_id_to_target_id`` as a parameter of
``draft_vocab_size`` zeros whenever ``draft_vocab_size`` differs from the target's vocabulary, fills it from
the checkpoint's ``d2t`` tensor when there is one, and scores draft id i as target id ``i + d2t[i]``
(``compute_logits``); ``t2d`` is skipped. A missing ``d2t`` therefore maps draft id i onto target id i: every
draft lands on the first ``draft_vocab_size`` target tokens. The tensors' values are read by the caller
(``spectrace.vllm_objects.weights.read_vocab_maps``: small tensors, bounded); this module only judges them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from spectrace.audit import codes
from spectrace.audit.findings import Finding
from spectrace.readings import VocabTensor  # noqa: F401  (audit.vocab.VocabTensor: the name judges use)

INTEGER_DTYPES = ("I64", "I32", "I16", "U32", "U16", "I8", "U8")
MASK_DTYPES = ("BOOL", "U8")
SHOWN = 8
RULE = ("compute_logits of vLLM's reduced-vocabulary drafters (vllm.model_executor.models.llama_eagle3, qwen3_eagle3, "
        "qwen3_dflash, ...): target = i + draft_id_to_target_id[i], zeros until a d2t tensor loads")


def audit_vocab_map(
    *,
    draft_vocab_size: Any,
    target_vocab_size: Any,
    checkpoint_read: bool,
    d2t: VocabTensor | None,
    t2d: VocabTensor | None,
    role: str = "draft",
) -> list[Finding]:
    """``DRAFT_VOCAB_MAP_MISSING`` / ``DRAFT_VOCAB_MAP_INVALID``; nothing when the vocabularies are equal,
    a size is unknown, or the checkpoint could not be read (a config-only directory)."""
    if not (isinstance(draft_vocab_size, int) and isinstance(target_vocab_size, int)) or isinstance(draft_vocab_size, bool):
        return []
    n, vocab = draft_vocab_size, target_vocab_size
    if not 0 < n < vocab or not checkpoint_read:
        return []
    base = {"draft_vocab_size": n, "target_vocab_size": vocab, "vllm_rule": RULE,
            "d2t": _describe(d2t), "t2d": _describe(t2d)}
    if d2t is None:
        return [codes.finding(
            codes.DRAFT_VOCAB_MAP_MISSING,
            model_role=role,
            message=f"the drafter drafts from {n} of the target's {vocab} tokens but its checkpoint has no d2t map: "
            f"vLLM's draft_id_to_target_id stays zero, so draft id i is scored as target id i and every draft lands "
            f"on target tokens 0..{n - 1}",
            evidence=base,
        )]
    problems: list[str] = []
    if d2t.dtype not in INTEGER_DTYPES:
        problems.append(f"d2t is {d2t.dtype}, not an integer tensor")
    if d2t.shape != (n,):
        problems.append(f"d2t has shape {list(d2t.shape)}, not [{n}] (one offset per draft id)")
    targets: list[int] | None = None
    if not problems and d2t.values is not None and len(d2t.values) == n:
        offsets = [int(v) for v in d2t.values]
        targets = [i + o for i, o in enumerate(offsets)]
        outside = [(i, t) for i, t in enumerate(targets) if not 0 <= t < vocab]
        if outside:
            problems.append(f"{len(outside)} draft id(s) map outside the target vocabulary 0..{vocab - 1} "
                            f"(draft id -> target id: {', '.join(f'{i}->{t}' for i, t in outside[:SHOWN])})")
        if n > 1 and all(o == i for i, o in enumerate(offsets)):
            problems.append("d2t holds the target ids themselves (d2t[i] = i), not offsets: vLLM adds i again "
                            "and draft id i lands on target id 2i")
        elif not any(offsets):
            problems.append(f"d2t is all zero: draft id i is scored as target id i, the first {n} target tokens")
        else:
            seen: dict[int, int] = {}
            clashes = []
            for i, t in enumerate(targets):
                if t in seen:
                    clashes.append((seen[t], i, t))
                seen.setdefault(t, i)
            if clashes:
                problems.append(f"{len(clashes)} pair(s) of draft ids land on the same target id "
                                f"({', '.join(f'{a},{b}->{t}' for a, b, t in clashes[:SHOWN])})")
    elif d2t.error:
        base["d2t_read"] = d2t.error
    findings = []
    if problems:
        findings.append(codes.finding(
            codes.DRAFT_VOCAB_MAP_INVALID, "error",
            model_role=role,
            message="the drafter's d2t map does not map its " + str(n) + " draft ids onto distinct target ids: "
            + "; ".join(problems),
            evidence={**base, "problems": problems},
        ))
        return findings
    mask_problems: list[str] = []
    if t2d is not None:
        if t2d.dtype not in MASK_DTYPES or t2d.shape != (vocab,):
            mask_problems.append(f"t2d is {t2d.dtype} {list(t2d.shape)}, not a boolean mask of [{vocab}]")
        elif t2d.values is not None:
            marked = sum(1 for v in t2d.values if v)
            if marked != n:
                mask_problems.append(f"t2d marks {marked} target ids, not {n}")
            if targets is not None and len(t2d.values) == vocab:
                unmarked = [t for t in targets if not t2d.values[t]]
                if unmarked:
                    mask_problems.append(f"{len(unmarked)} target id(s) d2t maps onto are unmarked in t2d "
                                         f"({', '.join(map(str, unmarked[:SHOWN]))})")
    if mask_problems:
        findings.append(codes.finding(
            codes.DRAFT_VOCAB_MAP_INVALID, "warning",
            model_role=role,
            message="the drafter's t2d mask disagrees with its d2t map (vLLM skips t2d; tools that read it do not): "
            + "; ".join(mask_problems),
            evidence={**base, "problems": mask_problems},
        ))
    return findings


def _describe(tensor: VocabTensor | None) -> dict[str, Any] | None:
    if tensor is None:
        return None
    return {"dtype": tensor.dtype, "shape": list(tensor.shape), "read": tensor.values is not None,
            **({"error": tensor.error} if tensor.error else {})}
