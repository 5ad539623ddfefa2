"""`spectrace doctor`: the config audit before deployment, from config.json files alone.

``spectrace doctor --target PATH --draft PATH [--method M] [--num-speculative-tokens K]
[--runner v1|v2] [--max-model-len N] [--json]``

No engine is started and no weight is read. Doctor runs the installed vLLM's own
code on the two ``config.json`` files, exactly where a live run (``spectrace.tracer``)
captures the same values, and feeds the results to the same pure audit
(``spectrace.audit``):

- config resolution: ``vllm.engine.arg_utils.EngineArgs.create_engine_config``, with
  ``vllm.config.model.get_config`` (the consumer's name for
  ``vllm.transformers_utils.config.get_config``, transformers' gates included) captured
  per model, as the live frontend hook does; ``SpeculativeConfig.__post_init__`` infers
  the method and wraps EAGLE / DFlash drafts in ``EAGLEConfig``; ``VllmConfig``
  validates the pair against the chosen model runner.
- layout: the target and the drafter modules are built on the meta device with
  ``vllm.model_executor.model_loader.utils.initialize_model`` (no memory, no weights),
  in a one-process gloo group. A DFlash drafter's layers therefore go through
  ``qwen3_dflash._resolve_layer_attention``; every other model through its class's own
  per-layer rule and ``Attention.__init__`` (``per_layer_sliding_window``, else
  ``cache_config.sliding_window``). The runtime window of a layer is the
  ``sliding_window`` its ``Attention`` module stores.
- hidden-state taps (eagle3, dflash): the ids the chosen runner would tap, from its own
  resolver (V2: ``eagle3_utils.get_eagle3_aux_layers_from_config``; V1:
  ``GPUModelRunner._get_eagle3_aux_layers_from_config``, called unbound), else the
  meta-built target's ``get_eagle3_default_aux_hidden_state_layers()``, set on that
  target with its own ``set_aux_hidden_state_layers`` (sorted, de-duplicated); the
  number of taps the drafter takes from its meta-built ``fc``. The same
  ``spectrace.audit.audit_taps`` as a live run (``spectrace.tracer.taps``).
- runner: ``--runner`` replaces ``VllmConfig.use_v2_model_runner`` for the whole run
  (``v2`` as with ``VLLM_USE_V2_MODEL_RUNNER=1``, ``v1`` as with ``=0``); for ``v2``
  the host's missing Triton (a CPU build) is not held against the pair.

A refusal by vLLM (a raised error) becomes a ``LOAD_FAILED`` finding explained by
``spectrace.audit.explain_load_error``, as in a live run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NoReturn

from spectrace.configs import config_to_dict

RUNNERS = ("v1", "v2")
DEFAULT_RUNNER = "v2"
DEFAULT_K = 3

# Methods whose drafter is a model (doctor needs a --draft path for them).
_MODEL_FREE_METHODS = {"ngram", "[ngram]", "ngram_gpu", "suffix", "custom_class", "extract_hidden_states"}

# The vLLM functions behind each expected value (evidence key "vllm_rule").
RULE_GET_CONFIG = "vllm.transformers_utils.config.get_config"
RULE_SPEC = "vllm.config.speculative.SpeculativeConfig.__post_init__"
RULE_DRAFT_VOCAB = "vllm.config.speculative.SpeculativeConfig.verify_equal_vocab_size_if_draft_model"
RULE_VOCAB = "vllm.config.model.ModelConfig.get_vocab_size"
RULE_MAX_LEN = "vllm.config.model._get_and_verify_max_len"
RULE_DFLASH = "vllm.model_executor.models.qwen3_dflash._resolve_layer_attention"
RULE_ATTENTION = "vllm.model_executor.layers.attention.attention.Attention.__init__"
RULE_RUNNER = "vllm.config.vllm.VllmConfig._validate_{runner}_model_runner"
# Hidden-state taps: each runner's own id resolution, then the target's default.
RULE_TAPS = {
    "v2": "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils.get_eagle3_aux_layers_from_config",
    "v1": "vllm.v1.worker.gpu_model_runner.GPUModelRunner._get_eagle3_aux_layers_from_config",
}
RULE_DFLASH_FC = "vllm.model_executor.models.qwen3_dflash._get_dflash_fc_input_size"
RULE_LLAMA_EAGLE3_FC = "vllm.model_executor.models.llama_eagle3.LlamaModel.__init__"
# The methods whose target feeds hidden states to the drafter, per runner: V2
# (v1/worker/gpu/model_runner.py) sets use_aux_hidden_state_outputs for these; V1
# (v1/worker/gpu_model_runner.py) for dflash, and for eagle3 when the drafter uses them.
TAP_METHODS = {"v2": ("eagle3", "dflash", "dspark"), "v1": ("eagle3", "dflash")}
TAP_KEYS = ("declared_field", "declared_ids", "expected_ids", "tapped_ids", "input_taps", "status", "vllm_rule")

_QUIET_LOGGERS = ("vllm", "transformers", "torch", "huggingface_hub", "filelock", "urllib3")


class DoctorInputError(Exception):
    """Bad input: a missing path, an unreadable or invalid config.json, an unknown option value."""


# -- inputs ------------------------------------------------------------------------


def load_declared(path: str, role: str) -> dict[str, Any]:
    """The ``config.json`` of a local model directory, as written."""
    directory = Path(path)
    if not directory.exists():
        raise DoctorInputError(f"{role} path {path!r} does not exist")
    if not directory.is_dir():
        raise DoctorInputError(f"{role} path {path!r} is not a directory (give the model directory)")
    file = directory / "config.json"
    if not file.is_file():
        raise DoctorInputError(f"{role} directory {path!r} has no config.json")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DoctorInputError(f"cannot read {file}: {exc.__class__.__name__}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DoctorInputError(f"{file} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict):
        raise DoctorInputError(f"{file} must hold a JSON object, not {type(data).__name__}")
    return data


def _positive_int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise DoctorInputError(f"{name} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise DoctorInputError(f"{name} must be a positive integer, got {value!r}")
    return number


def model_methods() -> list[str]:
    """The speculative methods of the installed vLLM that take a draft model."""
    from typing import get_args

    from vllm.config.speculative import SpeculativeMethod

    def flatten(tp: Any) -> Iterator[str]:
        for arg in get_args(tp):
            if isinstance(arg, str):
                yield arg
            else:
                yield from flatten(arg)

    return sorted({m for m in flatten(SpeculativeMethod) if m not in _MODEL_FREE_METHODS})


# -- the result ----------------------------------------------------------------------


@dataclass
class Report:
    runner: str
    target: str
    draft: str
    method: str | None
    method_given: bool
    num_speculative_tokens: int
    max_model_len: int | None = None
    findings: list[Any] = field(default_factory=list)  # spectrace.audit.Finding
    layout: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"target": [], "draft": []})
    rules: dict[str, str] = field(default_factory=dict)
    architectures: dict[str, str] = field(default_factory=dict)
    taps: dict[str, Any] | None = None  # the hidden-state tap audit (TAP_KEYS); None when no taps apply
    vllm_version: str | None = None
    seconds: float = 0.0

    @property
    def has_error(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "target": self.target,
            "draft": self.draft,
            "method": self.method,
            "method_given": self.method_given,
            "num_speculative_tokens": self.num_speculative_tokens,
            "max_model_len": self.max_model_len,
            "vllm_version": self.vllm_version,
            "architectures": self.architectures,
            "rules": self.rules,
            "findings": [
                {
                    "code": f.code,
                    "severity": f.severity,
                    "component": f.component,
                    "model_role": f.model_role,
                    "message": f.message,
                    "evidence": f.evidence,
                    "fix": f.fix,
                    "caused_by": f.caused_by,
                }
                for f in self.findings
            ],
            "layout": self.layout,
            "taps": self.taps,
            "seconds": round(self.seconds, 3),
        }


# -- process-wide switches, all restored ----------------------------------------------


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """vLLM / transformers below ERROR go nowhere, and stray prints go to stderr."""
    env = {
        "VLLM_LOGGING_LEVEL": "ERROR",  # read when vLLM configures its logger (first import)
        "TRANSFORMERS_VERBOSITY": "error",
        "SPECTRACE": "0",  # doctor is not a traced run: the plugin must stay idle
        "HF_HUB_OFFLINE": "1",  # local directories only: nothing is fetched
    }
    levels = {}
    for name in _QUIET_LOGGERS:
        logger = logging.getLogger(name)
        levels[name] = logger.level
        logger.setLevel(logging.ERROR)
    try:
        with _env(**env), warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def runner_rules(runner: str) -> Iterator[None]:
    """Make the installed vLLM apply the rules of model runner ``runner``.

    ``VllmConfig.use_v2_model_runner`` is what every consumer reads (config validation,
    ``qwen3_dflash._resolve_layer_attention`` through ``get_current_vllm_config()``).
    For ``v2`` on a host without Triton (the CPU build) ``_validate_v2_model_runner``
    would refuse for the host's sake, so its ``HAS_TRITON`` reads True meanwhile.
    """
    import vllm.config.vllm as vllm_config_module
    from vllm.config import VllmConfig

    use_v2 = runner == "v2"
    saved_property = VllmConfig.__dict__["use_v2_model_runner"]
    saved_triton = vllm_config_module.HAS_TRITON
    VllmConfig.use_v2_model_runner = property(lambda self: use_v2)
    if use_v2:
        vllm_config_module.HAS_TRITON = True
    try:
        yield
    finally:
        VllmConfig.use_v2_model_runner = saved_property
        vllm_config_module.HAS_TRITON = saved_triton


@contextlib.contextmanager
def capture_get_config(captures: list[tuple[str, Any, BaseException | None]]) -> Iterator[None]:
    """Note every ``get_config`` call of config resolution (the live hook's site)."""
    import vllm.config.model as model_module

    original = model_module.get_config

    def get_config(model, *args, **kwargs):
        try:
            config = original(model, *args, **kwargs)
        except BaseException as exc:
            captures.append((str(model), None, exc))
            raise
        captures.append((str(model), config, None))
        return config

    model_module.get_config = get_config
    try:
        yield
    finally:
        model_module.get_config = original


@contextlib.contextmanager
def single_process_group(vllm_config: Any) -> Iterator[None]:
    """A world-size-1 gloo group over a temporary file (no network), as model builds need."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        yield
        return
    fd, store = tempfile.mkstemp(prefix="spectrace-doctor-")
    os.close(fd)
    os.unlink(store)
    try:
        with set_current_vllm_config(vllm_config):
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{store}", backend="gloo"
            )
            parallel_state.ensure_model_parallel_initialized(1, 1)
        yield
    finally:
        with contextlib.suppress(Exception):
            parallel_state.destroy_model_parallel()
        with contextlib.suppress(Exception):
            parallel_state.destroy_distributed_environment()
        with contextlib.suppress(OSError):
            os.unlink(store)


# -- helpers ----------------------------------------------------------------------


def _inner_errors(exc: BaseException) -> list[BaseException]:
    """The errors a pydantic ``ValidationError`` wraps (vLLM configs are pydantic dataclasses)."""
    inner = []
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        try:
            for error in errors():
                wrapped = (error.get("ctx") or {}).get("error")
                if isinstance(wrapped, BaseException):
                    inner.append(wrapped)
        except Exception:
            return []
    return inner


def _error_text(exc: BaseException) -> str:
    inner = _inner_errors(exc)
    if inner:
        return "; ".join(f"{type(e).__name__}: {e}" for e in inner)
    return f"{type(exc).__name__}: {exc}"


def _raising_function(exc: BaseException) -> str | None:
    """The innermost vLLM function on the traceback: the rule that refused."""
    inner = _inner_errors(exc)
    if inner:
        exc = inner[0]
    found = None
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module == "vllm" or module.startswith("vllm."):
            code = tb.tb_frame.f_code
            found = f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
        tb = tb.tb_next
    return found


def _qualname(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _same_path(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


# -- building on the meta device --------------------------------------------------------


def _build(vllm_config: Any, model_config: Any, prefix: str = "") -> Any:
    import torch
    from vllm.model_executor.model_loader.utils import initialize_model

    with torch.device("meta"):
        return initialize_model(vllm_config, model_config=model_config, prefix=prefix)


def _draft_build_config(vllm_config: Any) -> tuple[Any, str]:
    """The VllmConfig and prefix the runner builds the drafter with.

    Read from vLLM's source: EAGLE / DFlash drafters are built from the run's config
    with ``model_config=draft_model_config`` (``v1/spec_decode/llm_base_proposer.py``,
    ``v1/worker/gpu/spec_decode/dflash/utils.py``); a ``draft_model`` drafter from a copy
    whose ``model_config`` is the draft's, under prefix ``draft_model``
    (``v1/spec_decode/draft_model.py``, ``v1/worker/gpu/spec_decode/standalone_ar``).
    """
    from vllm.config.utils import replace

    spec = vllm_config.speculative_config
    if spec.method == "draft_model":
        return replace(vllm_config, model_config=spec.draft_model_config, quant_config=None), "draft_model"
    return vllm_config, ""


def _runtime_layers(model: Any, vllm_config: Any) -> list[dict[str, Any]]:
    """The attention layers of one built model, in build order, with what they execute."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    from spectrace import audit

    context = vllm_config.compilation_config.static_forward_context
    by_id = {id(layer): name for name, layer in context.items() if isinstance(layer, AttentionLayerBase)}
    causal_of = {}
    for module in model.modules():
        attn = getattr(module, "attn", None)
        if attn is not None and isinstance(getattr(module, "causal", None), bool):
            causal_of[id(attn)] = module.causal
    layers = []
    for module in model.modules():
        if id(module) not in by_id:
            continue
        window = getattr(module, "sliding_window", None)
        if isinstance(window, (tuple, list)):
            window = window[0] if window else None
        window = window if isinstance(window, int) and window > 0 else None
        try:
            spec = type(module.get_kv_cache_spec(vllm_config)).__name__
        except Exception:
            spec = None
        layers.append(
            {
                "layer_name": by_id[id(module)],
                "runtime_type": audit.SLIDING if window else audit.FULL,
                "runtime_window": window,
                "kv_cache_spec": spec,
                "causal": causal_of.get(id(module)),
            }
        )
    return layers


def _layout_rows(plans: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "layer": p.layer_index,
            "declared_type": p.declared_type,
            "declared_window": p.declared_window,
            "resolved_type": p.resolved_type,
            "resolved_window": p.resolved_window,
            "runtime_type": p.runtime_type,
            "runtime_window": p.runtime_window,
            "layer_name": p.layer_name,
            "kv_cache_spec": p.kv_cache_spec,
            "causal": p.causal,
        }
        for p in plans
    ]


def _layer_rule(model_config: Any, model_class: Any | None) -> str:
    arch = getattr(model_config, "architecture", None) or ""
    if model_class is not None and "dflash" in _qualname(model_class).lower():
        return RULE_DFLASH
    if model_class is None and "dflash" in arch.lower():
        return RULE_DFLASH
    name = _qualname(model_class) if model_class is not None else arch
    return f"{name} -> {RULE_ATTENTION}"


# -- the diagnosis -------------------------------------------------------------------------


def diagnose(
    target: str,
    draft: str,
    *,
    method: str | None = None,
    num_speculative_tokens: int | None = None,
    runner: str = DEFAULT_RUNNER,
    max_model_len: int | None = None,
) -> Report:
    """Audit ``target`` + ``draft`` from their ``config.json`` files with vLLM's own rules.

    Raises :class:`DoctorInputError` for bad input; everything vLLM refuses is a finding.
    """
    started = time.perf_counter()
    if runner not in RUNNERS:
        raise DoctorInputError(f"unknown runner {runner!r} (choose from {', '.join(RUNNERS)})")
    k = _positive_int(num_speculative_tokens, "--num-speculative-tokens") or DEFAULT_K
    max_model_len = _positive_int(max_model_len, "--max-model-len")
    declared = {"target": load_declared(target, "target"), "draft": load_declared(draft, "draft")}
    with quiet():
        try:
            import vllm  # noqa: F401  (its logger reads VLLM_LOGGING_LEVEL on first import)
        except ImportError as exc:
            raise DoctorInputError(f"doctor applies the installed vLLM's rules, but vLLM cannot be imported: {exc}") from None
        if method is not None:
            known = model_methods()
            if method not in known:
                raise DoctorInputError(f"unknown method {method!r} (choose from {', '.join(known)})")
        with runner_rules(runner):
            report = _diagnose(target, draft, declared, method, k, runner, max_model_len)
    report.seconds = time.perf_counter() - started
    return report


def _diagnose(target, draft, declared, method, k, runner, max_model_len) -> Report:
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    from spectrace import audit
    from spectrace.tracer import audit_live

    report = Report(
        runner=runner,
        target=target,
        draft=draft,
        method=method,
        method_given=method is not None,
        num_speculative_tokens=k,
        vllm_version=getattr(vllm, "__version__", None),
    )

    # 1. config resolution, as EngineArgs.create_engine_config does it for `vllm serve`
    speculative: dict[str, Any] = {"model": draft, "num_speculative_tokens": k}
    if method is not None:
        speculative["method"] = method
    captures: list[tuple[str, Any, BaseException | None]] = []
    vllm_config = None
    config_error: BaseException | None = None
    with capture_get_config(captures):
        try:
            engine_args = EngineArgs(
                model=target, speculative_config=speculative, max_model_len=max_model_len, enforce_eager=True
            )
            vllm_config = engine_args.create_engine_config()
        except Exception as exc:  # vLLM refused: a finding, not a crash
            config_error = exc
    spec = vllm_config.speculative_config if vllm_config is not None else None
    if spec is not None:
        report.method = spec.method
        report.num_speculative_tokens = spec.num_speculative_tokens
    if vllm_config is not None:
        report.max_model_len = vllm_config.model_config.max_model_len

    # which get_config call was whose: the target resolves first (live: frontend.assign_roles)
    resolved: dict[str, Any] = {}
    want = [("target", target), ("draft", draft)]
    for path, config, _error in captures:
        for i, (role, role_path) in enumerate(want):
            if _same_path(path, role_path):
                resolved[role] = config
                want.pop(i)
                break

    models = [
        {"model_role": role, "declared": declared[role], "transformers_resolved": config_to_dict(resolved.get(role))}
        for role in ("target", "draft")
        if role in resolved
    ]
    report.architectures = {role: audit.architecture(declared[role]) for role in ("target", "draft")}

    # 2. the same audit as the live frontend (tracer.audit_live.audit_resolution)
    _, by_role = audit_live.config_findings(models, report.method)
    for role, role_findings in by_role.items():
        config_class = type(resolved.get(role)).__name__ if resolved.get(role) is not None else None
        for finding in role_findings:
            finding.evidence.setdefault("vllm_rule", RULE_GET_CONFIG)
            finding.evidence.setdefault("config_class", config_class)
    findings: list[audit.Finding] = [f for fs in by_role.values() for f in fs]
    target_resolved = config_to_dict(resolved.get("target"))
    pair = audit.audit_pair(
        method=report.method,
        method_given=method is not None,
        draft_path=draft,
        target=target_resolved,
        draft=declared["draft"],
        target_max_model_len=report.max_model_len,
    )
    for finding in pair:
        if finding.code in ("METHOD_MISMATCH", "METHOD_INFERRED"):
            finding.evidence.setdefault("vllm_rule", RULE_SPEC)
        elif finding.code == "VOCAB_MISMATCH":
            finding.evidence.setdefault("vllm_rule", RULE_DRAFT_VOCAB if report.method == "draft_model" else RULE_VOCAB)
        elif finding.code == "DRAFT_CONTEXT_SHORT":
            finding.evidence.setdefault("vllm_rule", RULE_MAX_LEN)
            finding.evidence.setdefault("target_max_model_len", report.max_model_len)
    findings += pair
    if config_error is not None:
        load = audit.explain_load_error(_error_text(config_error), findings)
        _annotate_refusal(load, config_error, runner, phase="config resolution")
        if resolved.get("target") is None:  # the target's own config did not resolve
            load.model_role = "target"
        findings.append(load)

    # 3. layout: what each layer is built with
    if vllm_config is None:
        for role in ("target", "draft"):
            if role in resolved:
                plans = audit.layer_plans(declared[role], config_to_dict(resolved[role]))
                report.layout[role] = _layout_rows(plans)
    else:
        findings += _layout(report, vllm_config, declared, runner)
    report.findings = findings
    return report


def _annotate_refusal(finding: Any, exc: BaseException, runner: str, *, phase: str) -> None:
    from spectrace import audit

    needs = audit.runner_refusal(finding.evidence.get("error", ""))
    rule = _raising_function(exc) or (RULE_RUNNER.format(runner=runner) if needs else None)
    finding.evidence.setdefault("vllm_rule", rule)
    finding.evidence.setdefault("phase", phase)
    finding.evidence.setdefault("runner", runner)


def _layout(report: Report, vllm_config: Any, declared: dict[str, Any], runner: str) -> list[Any]:
    from vllm.model_executor.model_loader.utils import get_model_architecture

    from spectrace import audit
    from spectrace.tracer import audit_live

    findings = []
    spec = vllm_config.speculative_config
    roles = [("target", vllm_config.model_config)]
    if spec is not None and getattr(spec, "draft_model_config", None) is not None and spec.method not in _MODEL_FREE_METHODS:
        roles.append(("draft", spec.draft_model_config))
    built: dict[str, list[dict[str, Any]]] = {}
    build_error: tuple[str, BaseException, str] | None = None  # (role, error, phase)
    use_taps = _taps_apply(spec, runner)
    kept: dict[str, Any] = {}  # the built models the tap audit reads (meta device: no memory)
    classes: dict[str, Any] = {}
    tapped: tuple[list[int] | None, str] | None = None
    refusal_rule: str | None = None  # where the runner refused, when no vLLM frame says it
    with single_process_group(vllm_config):
        for role, model_config in roles:
            try:
                model_class = get_model_architecture(model_config)[0]
            except Exception:
                model_class = None
            classes[role] = model_class
            report.rules[role] = _layer_rule(model_config, model_class)
            if build_error is not None:
                continue  # the runner stops at the first model it cannot build
            try:
                if role == "target":
                    config, prefix = vllm_config, ""
                else:
                    config, prefix = _draft_build_config(vllm_config)
                model = _build(config, model_config, prefix)
                built[role] = _runtime_layers(model, config)
                if use_taps:
                    kept[role] = model
                del model
            except Exception as exc:
                build_error = (role, exc, f"building the {role} model")
        if use_taps and "target" in kept:
            # V2 sets the target's taps right after building it, so a refusal there stops
            # the drafter's build; V1 sets them after the drafter is built
            # (v1/worker/gpu/model_runner.py vs v1/worker/gpu_model_runner.py, load_model)
            try:
                tapped = _tapped_ids(kept["target"], spec, runner)
            except ImportError:
                pass  # this vLLM has no such resolver: no tap audit, rather than a false refusal
            except Exception as exc:
                if build_error is None or (runner == "v2" and build_error[0] == "draft"):
                    if runner == "v2":
                        built.pop("draft", None)
                    build_error = ("target", exc, "setting the target's hidden-state taps")
                    refusal_rule = _TAP_SETTER[runner]
        if use_taps and tapped is not None:
            findings += _tap_audit(report, vllm_config, kept, classes.get("draft"), tapped, runner)
        kept.clear()

    for role, model_config in roles:
        role_declared = declared[role]
        final = config_to_dict(model_config.hf_config)
        plans = audit.layer_plans(role_declared, final)
        layers = built.get(role)
        if layers is None:
            report.layout[role] = _layout_rows(plans)
            continue
        for i, layer in enumerate(layers):
            if i >= len(plans):
                plans.append(audit.LayerPlan(layer_index=i))
            plan = plans[i]
            plan.layer_name = layer["layer_name"]
            plan.runtime_type = layer["runtime_type"]
            plan.runtime_window = layer["runtime_window"]
            plan.kv_cache_spec = layer["kv_cache_spec"]
            plan.causal = layer["causal"]
        plans = plans[: len(layers)]
        report.layout[role] = _layout_rows(plans)
        # the live worker's audit (tracer.layout.record_runtime_layout)
        causes, _ = audit_live.draft_root_causes(role_declared, final)
        for finding in audit.audit_layout(role, plans, causes):
            finding.evidence.setdefault("vllm_rule", report.rules.get(role))
            findings.append(finding)

    if build_error is not None:
        role, exc, phase = build_error
        # the live worker explains a build failure with the drafter's config findings
        draft_findings: list[Any] = []
        if spec is not None and getattr(spec, "draft_model_config", None) is not None:
            _, draft_findings = audit_live.draft_root_causes(
                declared["draft"], config_to_dict(spec.draft_model_config.hf_config)
            )
        load = audit.explain_load_error(_error_text(exc), draft_findings)
        load.model_role = role
        if refusal_rule and _raising_function(exc) is None:
            load.evidence["vllm_rule"] = refusal_rule
        _annotate_refusal(load, exc, runner, phase=phase)
        findings.append(load)
    return findings


# -- hidden-state taps -----------------------------------------------------------------------

# Where each runner sets the target's taps (and refuses a target without the EAGLE3 interface).
_TAP_SETTER = {
    "v2": "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils.set_eagle3_aux_hidden_state_layers",
    "v1": "vllm.v1.worker.gpu_model_runner.GPUModelRunner._setup_eagle3_aux_hidden_state_outputs",
}
_TAP_REFUSAL = {
    "v2": "Model does not support EAGLE3 interface",
    "v1": "Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested",
}


def _taps_apply(spec: Any, runner: str) -> bool:
    """Does the chosen runner feed target hidden states to this drafter?

    Only for methods whose target feeds hidden states to the drafter, and only when the
    drafter takes them: an EAGLE3 head with ``eagle_config.use_aux_hidden_state: false``
    (V1 then taps nothing: ``EagleProposer._get_eagle3_use_aux_hidden_state_from_config``)
    or a DFlash drafter with ``dflash_config.use_aux_hidden_state: false`` builds no ``fc``.
    """
    if spec is None or getattr(spec, "draft_model_config", None) is None:
        return False
    if spec.method not in TAP_METHODS[runner]:
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


def _resolve_tap_ids(spec: Any, runner: str) -> tuple[int, ...] | None:
    """The chosen runner's own id resolution from the drafter's config (None: nothing found)."""
    if runner == "v2":
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

        return get_eagle3_aux_layers_from_config(spec)
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # a method of the runner that reads nothing but self.speculative_config
    return GPUModelRunner._get_eagle3_aux_layers_from_config(SimpleNamespace(speculative_config=spec))


def _tapped_ids(target: Any, spec: Any, runner: str) -> tuple[list[int] | None, str]:
    """What the runner taps on this target, set on the (meta-built) target by vLLM's own setter.

    As both runners do: ids from the config, else the target's
    ``get_eagle3_default_aux_hidden_state_layers()``; ``set_aux_hidden_state_layers``
    sorts and de-duplicates them. Read back the way the live run reads them.
    """
    from vllm.model_executor.models.interfaces import supports_eagle3

    from spectrace.tracer import taps as tracer_taps

    if not supports_eagle3(target):
        raise RuntimeError(_TAP_REFUSAL[runner])
    rule = RULE_TAPS[runner]
    ids = _resolve_tap_ids(spec, runner)
    if not ids:
        ids = target.get_eagle3_default_aux_hidden_state_layers()
        default = getattr(type(target), "get_eagle3_default_aux_hidden_state_layers", None)
        name = _qualname(default) if default is not None else "get_eagle3_default_aux_hidden_state_layers"
        rule += f" -> None, so the target's default {name}"
    target.set_aux_hidden_state_layers(tuple(ids))
    return tracer_taps.tapped_ids(target), rule


def _fc_rule(draft: Any) -> str | None:
    """The vLLM function that sized the built drafter's ``fc`` (its owner's constructor)."""
    for module in draft.modules():
        if getattr(module, "fc", None) is not None and hasattr(module.fc, "input_size"):
            # the class's own name: @support_torch_compile replaces __init__ with a wrapper
            owner = type(module)
            if owner.__module__ == "vllm.model_executor.models.qwen3_dflash":
                return RULE_DFLASH_FC
            return f"{_qualname(owner)}.__init__"
    return None


def _config_input_taps(spec: Any, vllm_config: Any, draft_class: Any, hidden: int) -> tuple[int | None, str | None]:
    """The drafter's ``fc`` input width / target hidden size, the way vLLM sizes it from config.

    Used when the drafter did not build; the built drafter's ``fc`` is read otherwise.
    """
    module = getattr(draft_class, "__module__", "")
    config = spec.draft_model_config.hf_config
    width = None
    rule = _qualname(draft_class) if draft_class is not None else None
    try:
        if module == "vllm.model_executor.models.qwen3_dflash":
            from vllm.model_executor.models.qwen3_dflash import _get_dflash_fc_input_size

            width, rule = _get_dflash_fc_input_size(vllm_config), RULE_DFLASH_FC
        elif module == "vllm.model_executor.models.llama_eagle3":
            count = getattr(config, "num_aux_hidden_states", None)
            if count is None:
                ids = (getattr(config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
                count = len(ids) if ids else 3
            width = getattr(config, "target_hidden_size", config.hidden_size) * count
            rule = RULE_LLAMA_EAGLE3_FC
    except Exception:
        width = None
    if isinstance(width, int) and hidden and width % hidden == 0:
        return width // hidden, rule
    return None, rule


def _tap_audit(
    report: Report,
    vllm_config: Any,
    kept: dict[str, Any],
    draft_class: Any,
    tapped: tuple[list[int] | None, str],
    runner: str,
) -> list[Any]:
    """The live run's tap audit (``spectrace.tracer.taps.record_taps``) on the meta-built pair."""
    from spectrace import audit
    from spectrace.tracer import taps as tracer_taps

    spec = vllm_config.speculative_config
    hidden = int(vllm_config.model_config.hf_text_config.hidden_size)
    draft = kept.get("draft")
    if draft is not None:
        inputs, fc_rule = tracer_taps.input_taps(draft, hidden), _fc_rule(draft)
    else:
        inputs, fc_rule = _config_input_taps(spec, vllm_config, draft_class, hidden)
    ids, ids_rule = tapped
    rule = ids_rule + (f"; fc input width: {fc_rule}" if fc_rule else "")
    tap, findings = audit.audit_taps(
        draft=config_to_dict(spec.draft_model_config.hf_config),
        target_layers=tracer_taps.target_layer_count(kept["target"], vllm_config),
        tapped_ids=ids,
        input_taps=inputs,
        rule=rule,
    )
    report.taps = {
        "declared_field": tap.declared_field,
        "declared_ids": tap.declared_ids,
        "expected_ids": tap.expected_ids,
        "tapped_ids": tap.tapped_ids,
        "input_taps": tap.input_taps,
        "status": tap.status,
        "vllm_rule": rule,
    }
    for finding in findings:
        finding.evidence["runner"] = runner
        finding.evidence["ids_rule"] = ids_rule
        finding.evidence["fc_rule"] = fc_rule
    return findings


# -- output ----------------------------------------------------------------------------


def _cell(kind: str | None, window: int | None) -> str:
    if kind is None:
        return "-"
    if window:
        return f"{kind}({window})"
    return kind


def _layout_table(rows: list[dict[str, Any]]) -> str:
    from spectrace.cli import format_table

    columns = ["layer", "declared", "resolved", "runtime", "causal", "kv_cache_spec"]
    # runs of identical layers read as one row ("0-35")
    collapsed: list[list[Any]] = []
    previous = None
    for row in rows:
        values = (
            _cell(row["declared_type"], row["declared_window"]),
            _cell(row["resolved_type"], row["resolved_window"]),
            _cell(row["runtime_type"], row["runtime_window"]),
            "-" if row.get("causal") is None else str(row["causal"]).lower(),
            row.get("kv_cache_spec") or "-",
        )
        if collapsed and values == previous:
            first = str(collapsed[-1][0]).split("-")[0]
            collapsed[-1][0] = f"{first}-{row['layer']}"
        else:
            collapsed.append([str(row["layer"]), *values])
        previous = values
    return format_table(columns, collapsed, max_width=40)


def render_text(report: Report) -> str:
    lines = [
        f"spectrace doctor (vLLM {report.vllm_version}, {report.runner.upper()} model runner rules)",
        f"  target  {report.target}  [{report.architectures.get('target') or '?'}]",
        f"  draft   {report.draft}  [{report.architectures.get('draft') or '?'}]",
        f"  method  {report.method or '?'} ({'given' if report.method_given else 'inferred by vLLM'}), "
        f"num_speculative_tokens {report.num_speculative_tokens}, max_model_len {report.max_model_len or '?'}",
        "",
    ]
    for role in ("draft", "target"):
        rows = report.layout.get(role) or []
        if not rows:
            continue
        rule = report.rules.get(role)
        lines.append(f"{role} attention layout" + (f" (rule: {rule})" if rule else "") + ":")
        lines.append(_layout_table(rows))
        lines.append("")
    if report.taps is not None:
        lines.extend(_taps_lines(report))
        lines.append("")
    if not report.findings:
        lines.append("no findings: vLLM builds this pair as declared.")
    else:
        lines.append("findings:")
        # each root cause, then what follows from it (caused_by), indented
        codes = {f.code for f in report.findings if f.caused_by is None}
        shown: set[int] = set()
        for root in report.findings:
            if id(root) in shown or (root.caused_by is not None and root.caused_by in codes):
                continue
            shown.add(id(root))
            lines.extend(_finding_lines(root, indent="  "))
            for consequence in report.findings:
                if id(consequence) not in shown and root.caused_by is None and consequence.caused_by == root.code:
                    shown.add(id(consequence))
                    lines.extend(_finding_lines(consequence, indent="      "))
    errors = sum(f.severity == "error" for f in report.findings)
    warns = sum(f.severity == "warning" for f in report.findings)
    infos = sum(f.severity == "info" for f in report.findings)
    lines.append("")
    lines.append(f"{errors} error(s), {warns} warning(s), {infos} info ({report.seconds:.1f}s, no engine started)")
    return "\n".join(lines) + "\n"


def _taps_lines(report: Report) -> list[str]:
    taps = report.taps or {}

    def ids(value: Any) -> str:
        return "-" if value is None else "[" + ", ".join(str(i) for i in value) + "]"

    declared = (
        f"{taps['declared_field']} = {ids(taps['declared_ids'])}" if taps.get("declared_field") else "nothing (no layer ids)"
    )
    inputs = taps.get("input_taps")
    return [
        f"Hidden-state taps ({report.runner.upper()} model runner):",
        f"  declared  {declared}",
        f"  expected  {ids(taps.get('expected_ids'))}",
        f"  tapped    {ids(taps.get('tapped_ids'))}",
        f"  fc input  {'?' if inputs is None else f'{inputs} tap(s)'}",
        f"  status    {taps.get('status')}",
        f"  vLLM rule: {taps.get('vllm_rule')}",
    ]


def _finding_lines(finding: Any, *, indent: str) -> list[str]:
    role = finding.model_role or "-"
    caused = f" (caused by {finding.caused_by})" if finding.caused_by else ""
    out = [f"{indent}{finding.severity.upper():7s} {finding.code} [{role}]{caused}: {finding.message}"]
    if finding.fix:
        out.append(f"{indent}        fix: {finding.fix}")
    rule = finding.evidence.get("vllm_rule") if isinstance(finding.evidence, dict) else None
    if rule:
        out.append(f"{indent}        vLLM rule: {rule}")
    return out


# -- the command --------------------------------------------------------------------------


def _usage_error_class() -> type[Exception]:
    """``spectrace.cli.UsageError`` of the running CLI.

    Under ``python -m spectrace.cli`` the running module is ``__main__``, whose
    ``main()`` catches its own class, not the one ``import spectrace.cli`` would load.
    """
    running = sys.modules.get("__main__")
    spec = getattr(running, "__spec__", None)
    if spec is not None and spec.name == "spectrace.cli" and hasattr(running, "UsageError"):
        return running.UsageError
    from spectrace.cli import UsageError

    return UsageError


def cmd_doctor(args: argparse.Namespace) -> int:
    UsageError = _usage_error_class()

    if not args.target:
        raise UsageError("doctor needs --target PATH (a model directory with config.json)")
    if not args.draft:
        raise UsageError("doctor needs --draft PATH (a model directory with config.json)")
    try:
        report = diagnose(
            args.target,
            args.draft,
            method=args.method,
            num_speculative_tokens=args.num_speculative_tokens,
            runner=args.runner,
            max_model_len=args.max_model_len,
        )
    except DoctorInputError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        json.dump(report.as_dict(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report))
    return 1 if report.has_error else 0


def _one_line_error(message: str) -> NoReturn:
    print(f"spectrace: error: doctor: {message}", file=sys.stderr)
    sys.exit(2)


def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Register the ``doctor`` subcommand on the ``spectrace`` parser."""
    parser = sub.add_parser(
        "doctor",
        help="audit a target + drafter pair from config.json files alone (no GPU, no weights)",
        description=(
            "Before deployment: run the installed vLLM's config resolution and layer-layout rules on "
            "the target's and the drafter's config.json (no weights, no tokenizer, no engine) and report "
            "the findings a live run would. Exit 0: no error; 1: at least one error finding; 2: bad input."
        ),
    )
    parser.add_argument("--target", metavar="PATH", help="target model directory (config.json is enough)")
    parser.add_argument("--draft", metavar="PATH", help="drafter model directory (config.json is enough)")
    parser.add_argument("--method", help="speculative method as given to vLLM (default: let vLLM infer it, as it would)")
    parser.add_argument(
        "--num-speculative-tokens", metavar="K", help=f"draft tokens per step (default {DEFAULT_K})"
    )
    parser.add_argument(
        "--runner",
        default=DEFAULT_RUNNER,
        metavar="v1|v2",
        help="whose rules apply: v2 (default; vLLM 0.32's default on CUDA) or v1 (the CPU build's)",
    )
    parser.add_argument("--max-model-len", metavar="N", help="as vLLM's --max-model-len (default: derived by vLLM)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=cmd_doctor)
    parser.error = _one_line_error  # type: ignore[method-assign]
