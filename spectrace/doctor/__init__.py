"""`spectrace doctor`: the config audit before deployment, from config.json files alone.

``spectrace doctor --target PATH --draft PATH [--method M] [--num-speculative-tokens K]
[--runner v1|v2] [--max-model-len N] [--json]``

No engine is started and no weight is read. Doctor runs the installed vLLM's own
code on the two ``config.json`` files, exactly where a live run (``spectrace.recorder``)
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
  ``cache_config.sliding_window``). Each built model is read by the live worker's
  reader, ``spectrace.vllm_objects.layers`` (a layer's window: its backend implementation's,
  else the ``Attention`` module's).
- hidden-state taps (eagle3, dflash): the ids the chosen runner would tap, from its own
  resolver (V2: ``eagle3_utils.get_eagle3_aux_layers_from_config``; V1:
  ``GPUModelRunner._get_eagle3_aux_layers_from_config``, called unbound), else the
  meta-built target's ``get_eagle3_default_aux_hidden_state_layers()``, set on that
  target with its own ``set_aux_hidden_state_layers`` (sorted, de-duplicated); the
  number of taps the drafter takes from its meta-built ``fc``. The same
  ``spectrace.audit.audit_taps`` as a live run, fed by ``spectrace.vllm_objects.taps``.
- runner: ``--runner`` replaces ``VllmConfig.use_v2_model_runner`` for the whole run
  (``v2`` as with ``VLLM_USE_V2_MODEL_RUNNER=1``, ``v1`` as with ``=0``); for ``v2``
  the host's missing Triton (a CPU build) is not held against the pair.

A refusal by vLLM (a raised error) becomes a ``LOAD_FAILED`` finding explained by
``spectrace.audit.explain_load_error``, as in a live run.

The package, in the order doctor works:

- ``inputs``: the two ``config.json`` files and the options, checked before transformers or vLLM see them (bad
  input is a ``DoctorInputError``: one line);
- ``sandbox``: the process-wide switches for a dry build (quiet logs, a model runner's
  rules, ``get_config`` captured, a one-process group, builds on the meta device);
- ``diagnose``: resolution, builds and taps read with ``spectrace.vllm_objects``, judged by
  ``spectrace.audit`` — a :class:`Report`;
- ``render``: the report as text;
(The ``spectrace doctor`` subcommand is ``spectrace.cli.doctor``.)

Importing this package imports no vLLM: ``diagnose`` imports it when it runs.
"""

from spectrace.doctor.diagnose import (
    DEFAULT_K,
    DEFAULT_RUNNER,
    RULE_ATTENTION,
    RULE_DFLASH,
    RULE_DFLASH_FC,
    RULE_DRAFT_DTYPE,
    RULE_DRAFT_VOCAB,
    RULE_GET_CONFIG,
    RULE_LLAMA_EAGLE3_FC,
    RULE_MAX_LEN,
    RULE_ROPE,
    RULE_RUNNER,
    RULE_SPEC,
    RULE_TAPS,
    RULE_VOCAB,
    RULE_WEIGHTS,
    RUNNERS,
    TAP_KEYS,
    TAP_SETTER,
    Report,
    diagnose,
)
from spectrace.doctor.inputs import DoctorInputError, load_declared, model_methods
from spectrace.doctor.render import render_text

__all__ = [
    "DEFAULT_K", "DEFAULT_RUNNER", "RULE_ATTENTION", "RULE_DFLASH", "RULE_DFLASH_FC", "RULE_DRAFT_DTYPE",
    "RULE_DRAFT_VOCAB", "RULE_GET_CONFIG", "RULE_LLAMA_EAGLE3_FC", "RULE_MAX_LEN", "RULE_ROPE", "RULE_RUNNER", "RULE_SPEC",
    "RULE_TAPS", "RULE_VOCAB", "RULE_WEIGHTS",
    "RUNNERS", "TAP_KEYS", "TAP_SETTER", "DoctorInputError", "Report", "diagnose",
    "load_declared", "model_methods", "render_text",
]
