"""Hidden-state taps: which target layers feed the drafter, and how many its ``fc`` takes.

Read from built models, so the same for either model runner and for the live
worker (loaded models) and ``spectrace doctor`` (models built on the meta device).
vLLM 0.32:
- tapped ids: the target's ``EagleModelMixin.aux_hidden_state_layers``, found the way
  ``SupportsEagle3.set_aux_hidden_state_layers`` finds it (language model, then ``.model``);
- input taps: the drafter's ``fc`` input width / the target's hidden size.
Never hooks compiled or graph-captured code.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

# The methods whose target feeds hidden states to the drafter, per model runner: V2
# (v1/worker/gpu/model_runner.py) sets use_aux_hidden_state_outputs for these; V1
# (v1/worker/gpu_model_runner.py) for dflash, and for eagle3 when the drafter uses them.
TAP_METHODS = {"v2": ("eagle3", "dflash", "dspark"), "v1": ("eagle3", "dflash")}

RULE_DFLASH_FC = "vllm.model_executor.models.qwen3_dflash._get_dflash_fc_input_size"


def taps_apply(spec: Any, runner: str | None) -> bool:
    """Does model runner ``runner`` feed target hidden states to this drafter?

    Only for methods whose target feeds hidden states to the drafter, and only when the
    drafter takes them: an EAGLE3 head with ``eagle_config.use_aux_hidden_state: false``
    (V1 then taps nothing: ``EagleProposer._get_eagle3_use_aux_hidden_state_from_config``)
    or a DFlash drafter with ``dflash_config.use_aux_hidden_state: false`` builds no ``fc``.
    """
    if spec is None or getattr(spec, "draft_model_config", None) is None:
        return False
    methods = TAP_METHODS.get(runner or "", TAP_METHODS["v2"])
    if spec.method not in methods:
        return False
    hf_config = spec.draft_model_config.hf_config
    if spec.method == "dflash":
        dflash_config = getattr(hf_config, "dflash_config", None) or {}
        own = getattr(hf_config, "use_aux_hidden_state", True)
        return bool(dflash_config.get("use_aux_hidden_state", own) if isinstance(dflash_config, dict) else own)
    eagle_config = getattr(hf_config, "eagle_config", None)
    if isinstance(eagle_config, dict):
        return bool(eagle_config.get("use_aux_hidden_state", True))
    return True


def decoder(target: Any) -> Any:
    """The module that holds the target's layers and taps."""
    holder = target
    if hasattr(holder, "get_language_model"):
        try:
            holder = holder.get_language_model()
        except Exception:
            pass
    elif hasattr(holder, "language_model"):
        holder = holder.language_model
    return getattr(holder, "model", holder)


def tapped_ids(target: Any) -> list[int] | None:
    """The ids the target taps (vLLM's convention: k = output of layer k-1), None when unset."""
    layers = getattr(decoder(target), "aux_hidden_state_layers", None)
    return [int(i) for i in layers] if layers is not None else None


# What a tap captures, by what the decoder's forward appends (vLLM 0.32's model code, e.g. llama.py / qwen2.py:
# ``self._maybe_add_hidden_state(aux, idx + 1, hidden_states, residual)`` after layer idx, which appends
# ``hidden_states + residual``; deepseek_v2.py appends ``hidden_states + residual`` before layer idx;
# cohere2_moe.py appends the ``hidden_states`` its layers return): tap k is then the residual stream entering layer
# k, before that layer's input norm (tap N: the last layer's output, before the final norm).
CAPTURE_RESIDUAL = "the input of layer k: the residual stream (hidden_states + residual) before its input norm"
CAPTURE_RETURNED = "the input of layer k: the hidden_states layer k-1 returns, before layer k's input norm (no residual added by the model)"
_CAPTURES = (
    ("_maybe_add_hidden_state(", CAPTURE_RESIDUAL),
    ("= hidden_states + residual", CAPTURE_RESIDUAL),
    ("aux_hidden_states.append(hidden_states + residual)", CAPTURE_RESIDUAL),
    ("aux_hidden_states.append(hidden_states)", CAPTURE_RETURNED),
)


@functools.lru_cache(maxsize=64)
def _capture_of_class(cls: type) -> tuple[str | None, str | None]:
    owner = next((c for c in cls.__mro__ if "forward" in vars(c)), None)
    if owner is None:
        return None, None
    rule = f"{owner.__module__}.{owner.__qualname__}.forward"
    try:
        source = inspect.getsource(vars(owner)["forward"])
    except (OSError, TypeError):
        return None, rule
    for needle, point in _CAPTURES:
        if needle in source:
            if needle.startswith("_maybe_add_hidden_state"):  # the mixin's, unless the class has its own
                adder = next((c for c in cls.__mro__ if "_maybe_add_hidden_state" in vars(c)), None)
                if adder is None or adder.__module__ != "vllm.model_executor.models.interfaces":
                    return None, rule
            return point, rule
    return None, rule


def capture_point(target: Any) -> tuple[str | None, str | None]:
    """(what tap k captures, the forward that says so), read from the target decoder's model code; (None, rule) when
    its forward appends in a way not recognised (said as unknown, never guessed)."""
    holder = decoder(target)
    try:
        return _capture_of_class(type(holder))
    except Exception:
        return None, None


def target_layer_count(target: Any, vllm_config: Any) -> int:
    layers = getattr(decoder(target), "layers", None)
    if layers is not None:
        return len(layers)
    return int(vllm_config.model_config.hf_text_config.num_hidden_layers)


def target_hidden_size(vllm_config: Any) -> int:
    return int(vllm_config.model_config.hf_text_config.hidden_size)


def _fc(draft: Any) -> tuple[Any, Any] | None:
    """(owner, fc) of the drafter's input projection."""
    for module in draft.modules():
        fc = getattr(module, "fc", None)
        if fc is not None and (hasattr(fc, "input_size") or hasattr(fc, "in_features")):
            return module, fc
    return None


def input_taps(draft: Any, target_hidden: int) -> int | None:
    """How many target hidden states the drafter's ``fc`` takes (None: no such ``fc``)."""
    if draft is None or not target_hidden:
        return None
    found = _fc(draft)
    if found is None:
        return None
    width = getattr(found[1], "input_size", None) or getattr(found[1], "in_features", None)
    if isinstance(width, int) and width % target_hidden == 0:
        return width // target_hidden
    return None


def input_rule(draft: Any) -> str | None:
    """The vLLM function that sized the built drafter's ``fc`` (its owner's constructor)."""
    found = _fc(draft) if draft is not None else None
    if found is None:
        return None
    # the class's own name: @support_torch_compile replaces __init__ with a wrapper
    owner = type(found[0])
    if owner.__module__ == "vllm.model_executor.models.qwen3_dflash":
        return RULE_DFLASH_FC
    return f"{owner.__module__}.{owner.__qualname__}.__init__"


def default_taps(target: Any) -> tuple[list[int] | None, str | None]:
    """The ids the model runner falls back to when the drafter declares none, and the method that gives them:
    the target's ``get_eagle3_default_aux_hidden_state_layers`` (``SupportsEagle3``: ``(2, N//2, N-3)``
    unless the model class overrides it). (None, None) for a target without it."""
    method = getattr(target, "get_eagle3_default_aux_hidden_state_layers", None)
    if not callable(method):
        return None, None
    try:
        ids = sorted({int(i) for i in method()})
    except Exception:
        return None, None
    owner = getattr(type(target), "get_eagle3_default_aux_hidden_state_layers", None)
    rule = f"{owner.__module__}.{owner.__qualname__}" if owner is not None else "get_eagle3_default_aux_hidden_state_layers"
    return ids, rule


def tap_facts(vllm_config: Any, target: Any, draft: Any) -> dict[str, Any]:
    """What ``spectrace.audit.audit_taps`` judges, read from a built target and drafter."""
    from spectrace.vllm_objects.configs import config_to_dict

    spec = vllm_config.speculative_config
    default_ids, default_rule = default_taps(target)
    captures, capture_rule = capture_point(target)
    return {
        "capture_point": captures,
        "capture_rule": capture_rule,
        "default_ids": default_ids,
        "default_rule": default_rule,
        "draft": config_to_dict(spec.draft_model_config.hf_config),
        "target_layers": target_layer_count(target, vllm_config),
        "tapped_ids": tapped_ids(target),
        "input_taps": input_taps(draft, target_hidden_size(vllm_config)),
    }
