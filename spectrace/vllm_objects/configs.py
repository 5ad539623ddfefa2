"""Model configs as plain data: the declared ``config.json``, resolved configs, run info, roles.

Imports nothing heavy (transformers only when a config must come from the HF cache).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectrace.config_dicts import MODEL_FREE_METHODS


def read_declared(model: str) -> dict[str, Any] | None:
    """The raw ``config.json`` of ``model`` as written (local dir or HF cache)."""
    path = Path(model)
    if path.is_dir():
        file = path / "config.json"
        return json.loads(file.read_text()) if file.exists() else None
    try:
        from transformers import PretrainedConfig

        config_dict, _ = PretrainedConfig.get_config_dict(model, local_files_only=True)
        return config_dict
    except Exception:
        return None


def config_to_dict(config: Any) -> dict[str, Any] | None:
    """A config object as JSON data (``to_dict()``, values that JSON lacks as strings)."""
    if config is None:
        return None
    try:
        data = config.to_dict()
    except Exception:
        data = dict(getattr(config, "__dict__", {}))
    return json.loads(json.dumps(data, default=str))


# -- one engine's models ---------------------------------------------------------------


@dataclass
class ConfigCapture:
    """One call of vLLM's ``get_config`` (config resolution): the model path and what it returned."""

    model: str
    start_ns: int = 0
    end_ns: int = 0
    config: Any = None
    error: str | None = None


def model_configs(vllm_config: Any) -> dict[str, Any]:
    """``ModelConfig`` per role: the target's, and the drafter's when a drafter is a model."""
    configs = {"target": vllm_config.model_config}
    spec = vllm_config.speculative_config
    draft = getattr(spec, "draft_model_config", None) if spec is not None else None
    if draft is not None and spec.method not in MODEL_FREE_METHODS:
        configs["draft"] = draft
    return configs


def vllm_resolved(vllm_config: Any, role: str) -> Any:
    """vLLM's final config object of ``role`` (after its own overrides)."""
    if vllm_config is None:
        return None
    model_config = model_configs(vllm_config).get(role)
    return getattr(model_config, "hf_config", None)


def _speculative_args(engine_args: Any) -> dict[str, Any]:
    spec = getattr(engine_args, "speculative_config", None)
    if isinstance(spec, dict):
        return spec
    if spec is None:
        return {}
    return {k: getattr(spec, k, None) for k in ("model", "method", "num_speculative_tokens")}


def run_info(engine_args: Any, vllm_config: Any) -> dict[str, Any]:
    """Target, draft, method and runner of one engine, from whatever resolved.

    ``engine_args`` (what was asked) may be None (engine core, worker); ``vllm_config``
    (what resolved) is None when resolution failed.
    """
    spec_args = _speculative_args(engine_args)
    info: dict[str, Any] = {
        "target_model": str(getattr(engine_args, "model", "") or ""),
        "draft_model": spec_args.get("model"),
        "method": spec_args.get("method"),
        "method_inferred": bool(spec_args) and not spec_args.get("method"),
        "num_speculative_tokens": spec_args.get("num_speculative_tokens"),
        "model_runner": None,
        "parallel_drafting": None,
    }
    if vllm_config is not None:
        info["target_model"] = vllm_config.model_config.model
        spec = vllm_config.speculative_config
        if spec is not None:
            info["method"] = spec.method
            info["num_speculative_tokens"] = spec.num_speculative_tokens
            info["parallel_drafting"] = bool(getattr(spec, "parallel_drafting", False))
            draft = model_configs(vllm_config).get("draft")
            info["draft_model"] = draft.model if draft is not None else None
        info["model_runner"] = model_runner(vllm_config)
    if info["draft_model"] is not None:
        info["draft_model"] = str(info["draft_model"])
    return info


def scheduler_facts(vllm_config: Any) -> dict[str, Any] | None:
    """The scheduler's token budget and the speculation it must fit (``audit.token_budget_findings``'s
    arguments), from a resolved ``VllmConfig``; ``None`` without speculative decoding."""
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    sched = vllm_config.scheduler_config
    return {
        "method": spec.method,
        "k": spec.num_speculative_tokens,
        "parallel": bool(getattr(spec, "parallel_drafting", False)),
        "dynamic_k": getattr(spec, "num_speculative_tokens_per_batch_size", None),
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "chunked_prefill": bool(getattr(sched, "enable_chunked_prefill", False)),
    }


def prefix_cache_facts(vllm_config: Any) -> dict[str, Any]:
    """Prefix caching on, its block size, and whether vLLM drops the last matched block of a hit for an
    EAGLE-family drafter (``SpeculativeConfig.use_eagle_block_drop``: EAGLE, EAGLE3, MTP, DFlash, unless
    ``disable_eagle_block_drop``), from a resolved ``VllmConfig``."""
    cache = vllm_config.cache_config
    spec = vllm_config.speculative_config
    drop = getattr(spec, "use_eagle_block_drop", None) if spec is not None else None
    return {
        "enabled": bool(getattr(cache, "enable_prefix_caching", False)),
        "block_size": getattr(cache, "block_size", None),
        "eagle_block_drop": bool(drop()) if callable(drop) else False,
    }


def model_runner(vllm_config: Any) -> str | None:
    """``v2`` or ``v1``: which model runner this config selects (``v2`` where vLLM has no choice: 0.34 on)."""
    try:
        return "v2" if vllm_config.use_v2_model_runner else "v1"
    except AttributeError:
        return None if hasattr(type(vllm_config), "use_v2_model_runner") else "v2"
    except Exception:
        return None


def same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def assign_roles(captures: list[ConfigCapture], target: str | None, draft: str | None) -> dict[str, ConfigCapture]:
    """Which captured ``get_config`` call was the target's and which the draft's.

    The target resolves first; a drafter that is the target itself resolves again
    under the same path, so roles go by order, not only by path.
    """
    roles: dict[str, ConfigCapture] = {}
    want = [("target", target)]
    if draft:
        want.append(("draft", draft))
    for capture in captures:
        for i, (role, path) in enumerate(want):
            if path is not None and same_model(capture.model, path):
                roles[role] = capture
                want.pop(i)
                break
    return roles


# -- the drafter's config, stage by stage (issue #35) ------------------------------------------------------

RULE_SPECULATIVE = "vllm.config.speculative.SpeculativeConfig.__post_init__"
RULE_SPECULATORS_CONFIG = "vllm.transformers_utils.configs.speculators.base.SpeculatorsConfig.__init__"


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def drafter_stages(declared: dict[str, Any] | None, transformers_resolved: dict[str, Any] | None,
                   final: dict[str, Any] | None, transformers_class: str | None = None) -> list[Any]:
    """The drafter's config after each step of vLLM's resolution (``spectrace.readings.Stage``), the
    speculators step computed by running the installed vLLM's own
    ``SpeculatorsConfig.extract_transformers_pre_trained_config`` (its algorithm updater) on a copy of
    ``declared``. ``final``: the config vLLM builds the drafter from (``hf_config``), None where it did
    not resolve. Never raises: a step vLLM refuses is a stage with ``error``.
    """
    import copy

    from spectrace.readings import Stage, is_speculators

    stages: list[Stage] = []
    if is_speculators(declared):
        try:
            from vllm.transformers_utils.configs.speculators.algos import SUPPORTED_SPECULATORS_TYPES
            from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

            updater = SUPPORTED_SPECULATORS_TYPES.get(declared.get("speculators_model_type"))
            extract = SpeculatorsConfig.extract_transformers_pre_trained_config
            rule = _qualname(extract) + (f" -> {_qualname(updater)}" if updater is not None else "")
        except ImportError as exc:  # a vLLM without the speculators format
            return [Stage("vllm.transformers_utils.configs.speculators", None, f"ImportError: {exc}")]
        try:
            built = extract(copy.deepcopy(declared))
            config = json.loads(json.dumps(built, default=str)) if isinstance(built, dict) else None
            stages.append(Stage(rule, config, moves=_moves(extract, declared, config)))
        except Exception as exc:
            stages.append(Stage(rule, None, f"{type(exc).__name__}: {exc}"[:300]))
            return stages
        stages.append(Stage(RULE_SPECULATORS_CONFIG, transformers_resolved))
    else:
        rule = "vllm.transformers_utils.config.get_config" + (f" -> transformers {transformers_class}" if transformers_class else "")
        stages.append(Stage(rule, transformers_resolved))
    stages.append(Stage(RULE_SPECULATIVE, final))
    return stages


def _other(value: Any) -> Any:
    """Another value of the same kind (a probe's input), or None where there is no obvious one."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "_"
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [v + 1 for v in value]
    return None


def _dotted(config: dict[str, Any]) -> dict[str, str]:
    """A config's values by dotted key, one level into nested dicts, as JSON text (for comparing two builds)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update({f"{key}.{sub}": json.dumps(v, sort_keys=True, default=str) for sub, v in value.items()})
        else:
            flat[key] = json.dumps(value, sort_keys=True, default=str)
    return flat


def _moves(extract: Any, declared: dict[str, Any], built: dict[str, Any] | None) -> dict[str, list[str] | None]:
    """Where vLLM's speculators updater puts each top-level field that its output does not hold by name.

    Read by running the installed updater again on a copy with only that field's value changed: the keys of
    its output that change with it are where it went (``update_dflash``: ``mask_token_id`` ->
    ``dflash_config.mask_token_id``, ``aux_hidden_state_layer_ids`` -> ``eagle_aux_hidden_state_layer_ids`` and
    ``dflash_config.target_layer_ids``, ``sliding_window_non_causal`` -> ``dflash_config.causal``); ``[]``: no key
    changes, the updater does not read it; ``None``: not probed (no other value to try, or the probe raised)."""
    import copy

    if not isinstance(built, dict):
        return {}
    base = _dotted(built)
    moves: dict[str, list[str] | None] = {}
    for key, value in declared.items():
        if key in built or key == "transformer_layer_config" or isinstance(value, dict):
            continue
        other = _other(value)
        if other is None:
            moves[key] = None
            continue
        probe = copy.deepcopy(declared)
        probe[key] = other
        try:
            changed = extract(probe)
            flat = _dotted(json.loads(json.dumps(changed, default=str)))
        except Exception:
            moves[key] = None
            continue
        moves[key] = sorted(k for k in set(base) | set(flat) if base.get(k) != flat.get(k))
    return moves


def _flat(overrides: dict[str, Any]) -> dict[str, Any]:
    """A dict ``--hf-overrides`` as dotted keys, one level into nested dicts (``rope_parameters.factor``)."""
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(value, dict) and value:
            flat.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    return flat


def hf_override_facts(vllm_config: Any) -> list[dict[str, Any]] | None:
    """Per key of the run's dict ``--hf-overrides``: the value asked, the target's and the drafter's resolved
    values (``audit.draft_settings``); None without a model drafter or with a callable override."""
    from spectrace.config_dicts import _get

    configs = model_configs(vllm_config) if vllm_config is not None else {}
    overrides = getattr(configs.get("target"), "hf_overrides", None)
    if "draft" not in configs or not isinstance(overrides, dict) or not overrides:
        return None
    target, draft = config_to_dict(configs["target"].hf_config), config_to_dict(configs["draft"].hf_config)
    facts = []
    for key, asked in _flat(overrides).items():
        found = {role: _get(config, key, None) for role, config in (("target", target), ("draft", draft))}
        if found["draft"] is None and key.startswith("rope_scaling."):  # transformers 5 keeps it in rope_parameters
            found["draft"] = _get(draft, "rope_parameters." + key.split(".", 1)[1], None)
        facts.append({"key": key, "asked": asked, **found})
    return facts


def draft_runtime(vllm_config: Any, runner: Any) -> dict[str, Any]:
    """(asked, runs with) of the draft settings a loaded model runner can answer: the proposer's
    ``max_model_len`` and the drafter's tensor-parallel size (its layers' ``tp_size``)."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or "draft" not in model_configs(vllm_config):
        return {}
    proposer = next((p for p in (getattr(runner, "drafter", None), getattr(runner, "speculator", None)) if p is not None), None)
    runs_len = getattr(proposer, "max_model_len", None)
    draft = getattr(proposer, "model", None)
    tp = None
    if draft is not None:
        try:
            tp = next((int(m.tp_size) for m in draft.modules() if isinstance(getattr(m, "tp_size", None), int)), None)
        except Exception:
            tp = None
    return {
        "method": spec.method,
        "max_model_len": (getattr(spec, "max_model_len", None), runs_len if isinstance(runs_len, int) else None),
        "tensor_parallel_size": (getattr(spec, "draft_tensor_parallel_size", None), tp),
    }


def registered_class(architectures: list[str]) -> str | None:
    """``module.Class`` vLLM's model registry maps the first known architecture to, read from the registry's table
    (no model module is imported); None when none is registered."""
    try:
        from vllm.model_executor.models.registry import ModelRegistry

        models = ModelRegistry.models
    except Exception:
        return None
    for arch in architectures:
        entry = models.get(arch)
        module, name = getattr(entry, "module_name", None), getattr(entry, "class_name", None)
        if module is None:  # an out-of-tree class registered by object
            cls = getattr(entry, "model_cls", None)
            module, name = getattr(cls, "__module__", None), getattr(cls, "__qualname__", None)
        if module and name:
            return f"{module}.{name}"
    return None


def speculation_facts(vllm_config: Any) -> dict[str, Any] | None:
    """What vLLM builds and runs for the drafter (``audit.method``): the method, the drafter's resolved architectures
    and the class the registry maps them to, and the rejection sampler it verifies with. None without speculation."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return None
    draft = getattr(spec, "draft_model_config", None)
    architectures = [str(a) for a in (getattr(draft, "architectures", None) or [])] if draft is not None else []
    rates = getattr(spec, "synthetic_acceptance_rates", None)
    return {
        "method": getattr(spec, "method", None),
        "architectures": architectures,
        "model_class": registered_class(architectures) if architectures else None,
        "rejection_sample_method": getattr(spec, "rejection_sample_method", None),
        "synthetic_acceptance_length": getattr(spec, "synthetic_acceptance_length", None),
        "synthetic_acceptance_rates": [float(r) for r in rates] if rates is not None else None,
    }
