"""The diagnosis: vLLM's own config resolution and model builds on two config.json files.

Config resolution is ``EngineArgs.create_engine_config`` (with every ``get_config``
call captured, as the live frontend hook does); each model is then built on the meta
device and read with the same readers as a live worker (``spectrace.vllm_objects``); every
judgement is ``spectrace.audit``'s, composed by ``audit.judge`` as for the live frontend
and engine core. A refusal by vLLM (a raised error) becomes a ``LOAD_FAILED`` finding
explained by ``spectrace.audit.explain_load_error``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from spectrace import audit
from spectrace.audit import codes
from spectrace.audit.dtype import declared_dtype, dtype_name
from spectrace.audit.fields import relink as relink_fields
from spectrace.audit.rope import rope_of
from spectrace.audit.weights import audit_head, audit_weights, target_head_shape
from spectrace.console import bounded
from spectrace.doctor import sandbox
from spectrace.doctor.inputs import (
    DoctorInputError, _check_speculators, _positive_int, load_declared, model_methods, speculative_extra,
)
from spectrace.vllm_objects import layers as read_layers
from spectrace.vllm_objects import taps as read_taps
from spectrace.vllm_objects.configs import (
    ConfigCapture, assign_roles, config_to_dict, drafter_stages, model_configs, same_model, scheduler_facts,
    speculation_facts,
)
from spectrace.vllm_objects.taps import RULE_DFLASH_FC
from spectrace.vllm_objects.weights import Manifest, inert_parameters, read_manifest, read_vocab_maps

RUNNERS = ("v1", "v2")
DEFAULT_RUNNER = "v2"
DEFAULT_K = 3

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
RULE_LLAMA_EAGLE3_FC = "vllm.model_executor.models.llama_eagle3.LlamaModel.__init__"
RULE_DRAFT_DTYPE = "vllm.config.speculative.SpeculativeConfig.__post_init__ (dtype=self.target_model_config.dtype)"
RULE_ROPE = "vllm.model_executor.layers.rotary_embedding.get_rope (from the config's rope_parameters)"
RULE_WEIGHTS = (
    "vllm.model_executor.models.utils.AutoWeightsLoader.load_weights (from the drafter class's load_weights), "
    "dry-run on meta tensors of the checkpoint's safetensors headers"
)
TAP_KEYS = ("declared_field", "declared_ids", "expected_ids", "tapped_ids", "input_taps", "status", "vllm_rule",
            "capture_point", "capture_rule")


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
    # the scheduler's budget as `vllm serve` resolves it (vllm_objects.scheduler_facts): max_num_seqs,
    # max_num_batched_tokens, chunked_prefill, and which of the two were given (the others are vLLM's defaults for
    # this machine's platform); None without speculative decoding, where no budget rule applies
    scheduler: dict[str, Any] | None = None
    findings: list[Any] = field(default_factory=list)  # spectrace.audit.Finding
    layout: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"target": [], "draft": []})
    rules: dict[str, str] = field(default_factory=dict)
    architectures: dict[str, str] = field(default_factory=dict)
    taps: dict[str, Any] | None = None  # the hidden-state tap audit (TAP_KEYS); None when no taps apply
    # per role: checkpoint manifest (safetensors headers), declared dtype, dtype vLLM runs it in, resolved RoPE
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
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
            "scheduler": self.scheduler,
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
            "taps": bounded(self.taps),  # a config's million declared ids cut with a count, as in evidence
            "models": self.models,
            "seconds": round(self.seconds, 3),
        }


# -- vLLM's refusals ------------------------------------------------------------------


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


def _layer_rule(model_config: Any, model_class: Any | None) -> str:
    arch = getattr(model_config, "architecture", None) or ""
    if model_class is not None and "dflash" in _qualname(model_class).lower():
        return RULE_DFLASH
    if model_class is None and "dflash" in arch.lower():
        return RULE_DFLASH
    name = _qualname(model_class) if model_class is not None else arch
    return f"{name} -> {RULE_ATTENTION}"


# -- the diagnosis -------------------------------------------------------------------------


@contextlib.contextmanager
def _terminated_cleanly():
    """SIGTERM during a diagnosis exits through Python (status 143), so the sandbox's temporary
    files are removed by their own ``finally``; the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def diagnose(
    target: str,
    draft: str,
    *,
    method: str | None = None,
    num_speculative_tokens: int | None = None,
    runner: str = DEFAULT_RUNNER,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    speculative_config: "str | dict[str, Any] | None" = None,
) -> Report:
    """Audit ``target`` + ``draft`` from their ``config.json`` files with vLLM's own rules.

    Raises :class:`DoctorInputError` for bad input; everything vLLM refuses is a finding.
    """
    started = time.perf_counter()
    if runner not in RUNNERS:
        raise DoctorInputError(f"unknown runner {runner!r} (choose from {', '.join(RUNNERS)})")
    k = _positive_int(num_speculative_tokens, "--num-speculative-tokens") or DEFAULT_K
    max_model_len = _positive_int(max_model_len, "--max-model-len")
    scheduler_args = {
        name: number
        for name, number in (("max_num_seqs", _positive_int(max_num_seqs, "--max-num-seqs")),
                             ("max_num_batched_tokens", _positive_int(max_num_batched_tokens, "--max-num-batched-tokens")))
        if number is not None
    }
    extra = speculative_extra(speculative_config)
    declared = {"target": load_declared(target, "target"), "draft": load_declared(draft, "draft")}
    with sandbox.quiet():
        try:
            import vllm  # noqa: F401  (its logger reads VLLM_LOGGING_LEVEL on first import)
        except ImportError as exc:
            raise DoctorInputError(f"doctor applies the installed vLLM's rules, but vLLM cannot be imported: {exc}") from None
        _check_speculators(declared["draft"], draft)
        if method is not None:
            known = model_methods()
            if method not in known:
                raise DoctorInputError(f"unknown method {method!r} (choose from {', '.join(known)})")
        if runner not in sandbox.runners():
            raise DoctorInputError(f"vLLM {getattr(vllm, '__version__', '?')} has only model runner {', '.join(sandbox.runners())}: "
                                   f"--runner {runner} does not apply to it")
        with sandbox.runner_rules(runner), _terminated_cleanly():
            report = _diagnose(target, draft, declared, method, k, runner, max_model_len, scheduler_args, extra)
    report.seconds = time.perf_counter() - started
    return report


def _diagnose(target, draft, declared, method, k, runner, max_model_len, scheduler_args=None, extra=None) -> Report:
    import vllm
    from vllm.engine.arg_utils import EngineArgs

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
    speculative: dict[str, Any] = {**(extra or {}), "model": draft, "num_speculative_tokens": k}
    if method is not None:
        speculative["method"] = method
    captures: list[ConfigCapture] = []
    vllm_config = None
    config_error: BaseException | None = None
    with sandbox.capture_get_config(captures):
        try:
            engine_args = EngineArgs(
                model=target, speculative_config=speculative, max_model_len=max_model_len, enforce_eager=True,
                **(scheduler_args or {}),
            )
            vllm_config = engine_args.create_engine_config(usage_context=_serve_context())
        except Exception as exc:  # vLLM refused: a finding, not a crash
            config_error = exc
    spec = vllm_config.speculative_config if vllm_config is not None else None
    if spec is not None:
        report.method = spec.method
        report.num_speculative_tokens = spec.num_speculative_tokens
    if vllm_config is not None:
        report.max_model_len = vllm_config.model_config.max_model_len
    scheduler = scheduler_facts(vllm_config) if vllm_config is not None else None  # what the budget rule judges
    if scheduler is not None:
        report.scheduler = {**{key: scheduler[key] for key in ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill")},
                            "given": sorted(scheduler_args or {}), "platform": _platform_name()}

    # which get_config call was whose, as the live frontend assigns them
    resolved = {role: capture.config for role, capture in assign_roles(captures, target, draft).items() if capture.error is None}

    models = [
        {"model_role": role, "declared": declared[role], "transformers_resolved": config_to_dict(resolved.get(role))}
        for role in ("target", "draft")
        if role in resolved
    ]
    report.architectures = {role: audit.architecture(declared[role]) for role in ("target", "draft")}

    # 2. build each model on the meta device (when the configs resolved) and read what its layers run
    built: dict[str, list[dict[str, Any]]] | None = None
    built_from: dict[str, dict[str, Any] | None] | None = None
    findings: list[audit.Finding] = []
    build_refusal: audit.Finding | None = None
    manifests = {"target": read_manifest(target), "draft": read_manifest(draft)}
    runs_in = None
    if vllm_config is not None:
        built, findings, build_refusal = _build(report, vllm_config, declared, runner, manifests)
        built_from = {role: config_to_dict(c.hf_config) for role, c in model_configs(vllm_config).items()}
        runs_in = {role: dtype_name(c.dtype) for role, c in model_configs(vllm_config).items()}
    for role in ("target", "draft"):
        rope = rope_of((built_from or {}).get(role) or config_to_dict(resolved.get(role)))
        report.models.setdefault(role, {}).update(
            checkpoint=manifests[role].summary(),
            declared_dtype=declared_dtype(declared[role]),
            runs_in=(runs_in or {}).get(role),
            rope=rope.as_dict() if rope is not None else None,
        )

    draft_config = resolved.get("draft")
    stages = drafter_stages(declared["draft"], config_to_dict(draft_config), (built_from or {}).get("draft"),
                            type(draft_config).__name__ if draft_config is not None else None)

    # 3. the one judge (audit.judge), as the live frontend and engine core call it
    judged = audit.judge(
        audit.RunFacts(
            models,
            report.method,
            method_given=method is not None,
            draft_path=draft,
            max_model_len=report.max_model_len,
            built_from=built_from,
            runtime_layers=built,
            load_error=_error_text(config_error) if config_error is not None else None,
            scheduler=scheduler,
            runs_in=runs_in,
            checkpoint_dtypes={role: dtype_name(m.main_dtype()) for role, m in manifests.items()},
            drafter_stages=stages,
            vocab_maps=read_vocab_maps(draft),
            speculation=speculation_facts(vllm_config) if vllm_config is not None else None,
        )
    )
    report.layout.update({role: [plan.as_row() for plan in plans] for role, plans in judged.plans.items()})
    for finding in judged.findings:
        _annotate(report, finding, resolved, config_error)
    report.findings = judged.findings + findings + ([build_refusal] if build_refusal is not None else [])
    relink_fields(report.findings)  # field findings about the taps, next to the tap findings of the meta build
    return report


def _serve_context():
    """vLLM's usage context of `vllm serve` (its defaults for max_num_seqs and max_num_batched_tokens differ from
    an engine built in Python's), or None where this vLLM has none."""
    try:
        from vllm.usage.usage_lib import UsageContext

        return UsageContext.OPENAI_API_SERVER
    except (ImportError, AttributeError):
        return None


def _platform_name() -> str | None:
    try:
        from vllm.platforms import current_platform

        return str(getattr(current_platform, "device_name", None) or current_platform.device_type)
    except Exception:  # a platform that cannot say
        return None


def _annotate(report: Report, finding: Any, resolved: dict[str, Any], config_error: BaseException | None) -> None:
    """The vLLM function behind a finding of the judge (evidence ``vllm_rule``)."""
    if finding.component == "config":
        config = resolved.get(finding.model_role)
        finding.evidence.setdefault("vllm_rule", RULE_GET_CONFIG)
        finding.evidence.setdefault("config_class", type(config).__name__ if config is not None else None)
    elif finding.code in (codes.METHOD_MISMATCH, codes.METHOD_INFERRED):
        finding.evidence.setdefault("vllm_rule", RULE_SPEC)
    elif finding.code == codes.VOCAB_MISMATCH:
        finding.evidence.setdefault("vllm_rule", RULE_DRAFT_VOCAB if report.method == "draft_model" else RULE_VOCAB)
    elif finding.code == codes.DRAFT_CONTEXT_SHORT:
        finding.evidence.setdefault("vllm_rule", RULE_MAX_LEN)
        finding.evidence.setdefault("target_max_model_len", report.max_model_len)
    elif finding.code == codes.LOAD_FAILED and config_error is not None:
        _annotate_refusal(finding, config_error, report.runner, phase="config resolution")
        if resolved.get("target") is None:  # the target's own config did not resolve
            finding.model_role = "target"
    elif finding.component == "layout":
        finding.evidence.setdefault("vllm_rule", report.rules.get(finding.model_role))
    elif finding.code == codes.DRAFT_DTYPE_LOSSY:
        finding.evidence.setdefault("vllm_rule", RULE_DRAFT_DTYPE)
    elif finding.component == "rope":
        finding.evidence.setdefault("vllm_rule", RULE_ROPE)


def _annotate_refusal(finding: Any, exc: BaseException, runner: str, *, phase: str) -> None:
    needs = audit.runner_refusal(finding.evidence.get("error", ""))
    rule = _raising_function(exc) or (RULE_RUNNER.format(runner=runner) if needs else None)
    finding.evidence.setdefault("vllm_rule", rule)
    finding.evidence.setdefault("phase", phase)
    finding.evidence.setdefault("runner", runner)


def _build(
    report: Report, vllm_config: Any, declared: dict[str, Any], runner: str, manifests: dict[str, Manifest]
) -> tuple[dict[str, list[dict[str, Any]]], list[Any], Any]:
    """Each model built on the meta device: its layer rows, the tap findings, and vLLM's refusal to build (or None)."""
    from vllm.model_executor.model_loader.utils import get_model_architecture

    findings = []
    spec = vllm_config.speculative_config
    roles = list(model_configs(vllm_config).items())
    built: dict[str, list[dict[str, Any]]] = {}
    build_error: tuple[str, BaseException, str] | None = None  # (role, error, phase)
    use_taps = read_taps.taps_apply(spec, runner)
    kept: dict[str, Any] = {}  # the built models the tap audit reads (meta device: no memory)
    classes: dict[str, Any] = {}
    tapped: tuple[list[int] | None, str] | None = None
    refusal_rule: str | None = None  # where the runner refused, when no vLLM frame says it
    with sandbox.single_process_group(vllm_config):
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
                    config, prefix = sandbox.draft_build_config(vllm_config)
                model = sandbox.build_on_meta(config, model_config, prefix)
                built[role] = read_layers.attention_layers(model, config)
                if role == "draft":
                    own = not same_model(str(model_config.model), str(vllm_config.model_config.model))
                    findings += _weights_audit(report, model, manifests["draft"], spec.method, model_config, own,
                                               target_manifest=manifests["target"])
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
                    refusal_rule = TAP_SETTER[runner]
        if use_taps and tapped is not None:
            findings += _tap_audit(report, vllm_config, kept, classes.get("draft"), tapped, runner)
        kept.clear()

    if build_error is not None:
        role, exc, phase = build_error
        # as the live worker (recorder.layout.record_load_error): explained by the drafter's config findings
        draft_config = model_configs(vllm_config).get("draft")
        load = audit.explain_build_error(
            _error_text(exc),
            declared["draft"] if draft_config is not None else None,
            config_to_dict(draft_config.hf_config) if draft_config is not None else None,
        )
        load.model_role = role
        if refusal_rule and _raising_function(exc) is None:
            load.evidence["vllm_rule"] = refusal_rule
        _annotate_refusal(load, exc, runner, phase=phase)
        return built, findings, load
    return built, findings, None


# -- weights -----------------------------------------------------------------------------------


def _weights_audit(
    report: Report, model: Any, manifest: Manifest, method: str | None, model_config: Any, own_checkpoint: bool,
    target_manifest: Manifest | None = None,
) -> list[Any]:
    """The live run's weight audit (``spectrace.recorder.weights``) on the meta-built drafter: vLLM's own
    ``load_weights`` fed meta tensors of the checkpoint's header shapes."""
    facts = report.models.setdefault("draft", {})
    if manifest.error is not None:
        facts["dry_load"] = f"not run: {manifest.error}"
        return []
    try:
        loaded = sandbox.dry_load(model, manifest.tensors)
    except Exception as exc:  # a loader that needs data or refuses a shape: no judgement, said so
        facts["dry_load"] = f"vLLM's loader raised on meta tensors: {type(exc).__name__}: {str(exc)[:200]}"
        return []
    shared = sandbox.shared_modules(model, method)
    parameters = [name for name, _ in model.named_parameters()]
    facts.update(dry_load="ok", parameters=len(parameters), loaded=len(loaded), shared_with_target=shared)
    quantization = getattr(model_config, "quantization", None)
    tensors = manifest.tensors if own_checkpoint else None  # MTP: the target's tensors are the target's
    findings = audit_weights("draft", tensors=tensors, parameters=parameters, loaded=loaded, shared=shared,
                             quantization=str(quantization) if quantization is not None else None,
                             inert=inert_parameters(model))
    own = getattr(model, "has_own_lm_head", None)
    target = target_manifest if target_manifest is not None and target_manifest.error is None else None
    findings += audit_head("draft", tensors=tensors, shared=shared, has_own_lm_head=own if isinstance(own, bool) else None,
                           target_shape=target_head_shape(target.tensors) if target is not None else None)
    for finding in findings:
        finding.evidence["vllm_rule"] = RULE_WEIGHTS
    return findings


# -- hidden-state taps -----------------------------------------------------------------------

# Where each runner sets the target's taps (and refuses a target without the EAGLE3 interface).
TAP_SETTER = {
    "v2": "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils.set_eagle3_aux_hidden_state_layers",
    "v1": "vllm.v1.worker.gpu_model_runner.GPUModelRunner._setup_eagle3_aux_hidden_state_outputs",
}
_TAP_REFUSAL = {
    "v2": "Model does not support EAGLE3 interface",
    "v1": "Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested",
}


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
    return read_taps.tapped_ids(target), rule


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
    """The live run's tap audit (``spectrace.recorder.taps.record_taps``) on the meta-built pair."""
    spec = vllm_config.speculative_config
    draft = kept.get("draft")
    facts = read_taps.tap_facts(vllm_config, kept["target"], draft)
    ids, ids_rule = tapped
    facts["tapped_ids"] = ids
    if draft is not None:
        fc_rule = read_taps.input_rule(draft)
    else:  # the drafter did not build: its fc width the way vLLM sizes it from config
        facts["input_taps"], fc_rule = _config_input_taps(spec, vllm_config, draft_class, read_taps.target_hidden_size(vllm_config))
    rule = ids_rule + (f"; fc input width: {fc_rule}" if fc_rule else "")
    tap, findings = audit.audit_taps(**facts, rule=rule)
    report.taps = {
        "declared_field": tap.declared_field,
        "declared_ids": tap.declared_ids,
        "expected_ids": tap.expected_ids,
        "tapped_ids": tap.tapped_ids,
        "input_taps": tap.input_taps,
        "status": tap.status,
        "vllm_rule": rule,
        "capture_point": tap.capture_point,
        "capture_rule": facts.get("capture_rule"),
    }
    for finding in findings:
        finding.evidence["runner"] = runner
        finding.evidence["ids_rule"] = ids_rule
        finding.evidence["fc_rule"] = fc_rule
    return findings
