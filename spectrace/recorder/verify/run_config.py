"""What the drain reads of one run's ``VllmConfig`` (``RunConfig``), read once and shipped as plain values.

The engine core keeps each run's ``VllmConfig`` (``Capture.note_config``); the drain needs five parts of it:
the context facts (what the static judge reads of the run's configs: the collector judges them into boundaries,
root causes and method, ``spectrace.collector.judging.run_context``), the generation_config sampling defaults, the
prefix-cache facts, the scheduler facts and the reasoning parser's think markers. Nothing here judges.
"""

from __future__ import annotations

import logging

from spectrace.load_facts import plain
from spectrace.vllm_objects.configs import prefix_cache_facts, scheduler_facts
from spectrace.vllm_objects.requests import generation_defaults, think_markers

log = logging.getLogger("vllm.spectrace")

_UNREAD = object()


class RunConfig:
    """What the drain reads of one run's VllmConfig, as plain values, each part read once on first use: the
    context facts (``audit.RunFacts``' keywords and parallel drafting: ``_context_facts``), the generation_config
    sampling defaults, the prefix-cache facts and the scheduler facts. A config this reader does not know gives
    the neutral value of the part it fails (no boundaries, no defaults, no facts), never an error.

    Pickled (the shipper hands it to a pipeline process, which holds no VllmConfig), every part is read
    first, in the engine's process, with the runtime layers known then."""

    __slots__ = ("_config", "_layers", "_context", "_defaults", "_prefix", "_scheduler", "_think")

    def __init__(self, vllm_config, runtime_layers=lambda: None) -> None:
        self._config = vllm_config
        self._layers = runtime_layers  # () -> the runtime layers known now (read with the context)
        self._context = self._defaults = self._prefix = self._scheduler = self._think = _UNREAD

    def _read(self, slot: str, read, neutral):
        value = getattr(self, slot)
        if value is _UNREAD:
            value = neutral
            if self._config is not None:
                try:
                    value = read(self._config)
                except Exception as exc:  # a config this reader does not know
                    log.debug("spectrace: %s of this run not read: %s", slot[1:], exc)
            setattr(self, slot, value)
        return value

    def context_facts(self) -> tuple[dict, bool] | None:
        """(``audit.RunFacts``' keywords, parallel drafting) of the run's configs, or None where unread."""
        return self._read("_context", lambda c: _context_facts(c, self._layers()), None)

    def defaults(self) -> dict:
        return self._read("_defaults", lambda c: generation_defaults(c.model_config), {})

    def prefix(self) -> dict | None:
        return self._read("_prefix", prefix_cache_facts, None)

    def scheduler(self) -> dict | None:
        return self._read("_scheduler", scheduler_facts, None)

    def think(self) -> tuple[list[int], list[int]] | None:
        """The reasoning parser's think start and end token ids (None: no reasoning parser, no phases)."""
        return self._read("_think", think_markers, None)

    def __getstate__(self):
        return (self.context_facts(), self.defaults(), self.prefix(), self.scheduler(), self.think())

    def __setstate__(self, state) -> None:
        self._config, self._layers = None, lambda: None
        self._context, self._defaults, self._prefix, self._scheduler, self._think = state


def _context_facts(vllm_config, runtime_layers: dict | None = None) -> tuple[dict, bool]:
    """What the static judge reads of one run's configs (``audit.RunFacts``' keywords; ``runs_in``: the dtypes as
    text), and whether the drafter drafts in parallel.

    ``runtime_layers``: what the models run, where a worker loaded them in this process
    (``note_layout``). With workers in other processes (tensor parallelism, the
    multiprocess executor) the engine core holds no built model and no layer rows reach it,
    so the layout is judged from the configs alone and a LAYOUT_MISMATCH cannot be a root there. The drafter's
    vocabulary map is read here too (``DRAFT_VOCAB_MAP_*``: the root of a collapse and of one-id drafts).
    """
    from spectrace.vllm_objects.configs import config_to_dict, model_configs, read_declared
    from spectrace.vllm_objects.weights import read_vocab_maps

    configs = model_configs(vllm_config)
    spec = vllm_config.speculative_config
    models = [
        {"model_role": role, "declared": read_declared(c.model), "transformers_resolved": config_to_dict(c.hf_config)}
        for role, c in configs.items()
    ]
    facts = {
        "models": models,
        "method": getattr(spec, "method", None),
        "max_model_len": vllm_config.model_config.max_model_len,
        "runtime_layers": runtime_layers,
        "runs_in": {role: None if getattr(c, "dtype", None) is None else str(c.dtype) for role, c in configs.items()},
        # the d2t map (small, bounded): a missing one is the root of a collapse and of wrong-id drafts
        "vocab_maps": read_vocab_maps(configs["draft"].model) if "draft" in configs else None,
    }
    return plain(facts), bool(getattr(spec, "parallel_drafting", False))
