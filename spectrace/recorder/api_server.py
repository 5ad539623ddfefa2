"""spectrace's series on vLLM's own ``/metrics``, and the labels that join them to vLLM's.

The API server serves ``/metrics`` from two places, both built in
``entrypoints/serve/instrumentator/metrics.py::attach_router``:

- ``get_prometheus_registry()`` (imported by name there): the process-global
  ``REGISTRY``, or, when ``PROMETHEUS_MULTIPROC_DIR`` is set (``vllm serve
  --api-server-count N`` with N > 1, ``v1/metrics/prometheus.py``), a fresh
  registry holding a ``MultiProcessCollector``. It backs the ``/metrics`` mount
  and the Instrumentator; the collector is registered in whatever it returns.
- prometheus-fastapi-instrumentator's own ``/metrics`` route, which wins route
  matching and, in multiprocess mode, builds an ephemeral ``CollectorRegistry`` +
  ``MultiProcessCollector`` on every scrape (``instrumentation.py::expose``).
  The collector is added there by wrapping ``MultiProcessCollector.__init__``,
  in an API server process only.

spectrace never sets ``PROMETHEUS_MULTIPROC_DIR`` and registers nothing under a
``vllm:`` name. Labels: ``model_name`` is vLLM's ``served_model_name``; ``engine``
is the DP engine index (``parallel_config.data_parallel_index``), read in the
engine core (``Scheduler.__init__``, after vLLM loaded the plugin there) and in
each worker (``Worker.__init__``).

Offline engines (the ``LLM`` class) have no API server: ``LLMEngine.from_engine_args`` starts
the standalone endpoint on ``SPECTRACE_PROMETHEUS_PORT``. Neither has a headless node
(``vllm serve --headless``: the workers of a multi-node engine, or headless DP engines): its
launcher resolves the config with ``headless=True`` (``EngineArgs.create_engine_config``, hooked in
``spectrace.recorder.frontend``), which starts the same standalone endpoint there, on the same fixed
port, for the series of every process of that node.
"""

from __future__ import annotations

import weakref
from typing import Any

from spectrace.sinks import exposition
from spectrace.recorder import runtime
from spectrace.recorder.hooks import Hook

_registries: "weakref.WeakSet[Any]" = weakref.WeakSet()
_api_server = False


def _enabled() -> "runtime.Runtime | None":
    rt = runtime.get()
    if rt is None or "prometheus" not in rt.settings.exporters:
        return None
    return rt


def _count(hook: str):
    def on_error(exc: BaseException) -> None:
        rt = runtime.get()
        if rt is not None:
            rt.count_error(hook, exc)

    return on_error


def add_collector(registry: Any) -> None:
    """Register the file collector in ``registry`` (once per registry)."""
    rt = _enabled()
    if rt is None or registry is None or registry in _registries:
        return
    directory = exposition.server_dir(rt.settings.metrics_dir)
    registry.register(exposition.FileCollector(directory, on_error=_count("api_server.collect")))
    _registries.add(registry)


def wrap_get_prometheus_registry(original, hook: str):
    def get_prometheus_registry(*args, **kwargs):
        registry = original(*args, **kwargs)
        global _api_server
        _api_server = True  # a plain flag (this process serves /metrics), set even when the hook's work fails
        with runtime.guard(hook) as rt:
            if rt is not None:  # None: a fault injected into this hook, its work skipped
                add_collector(registry)
        return registry

    return get_prometheus_registry


def wrap_multiprocess_collector_init(original, hook: str):
    def __init__(self, registry, *args, **kwargs):
        original(self, registry, *args, **kwargs)
        if _api_server:
            with runtime.guard(hook) as rt:
                if rt is not None:
                    add_collector(registry)

    return __init__


def _note(vllm_config: Any, engine: bool) -> None:
    model_config = getattr(vllm_config, "model_config", None)
    name = getattr(model_config, "served_model_name", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    if name:
        exposition.PROCESS_LABELS["model_name"] = str(name)
    if engine:
        parallel = getattr(vllm_config, "parallel_config", None)
        index = getattr(parallel, "data_parallel_index", None)
        if index is None:
            index = getattr(parallel, "data_parallel_rank", 0)
        exposition.PROCESS_LABELS["engine"] = str(index)


def _config_arg(args: tuple, kwargs: dict) -> Any:
    return kwargs.get("vllm_config", args[0] if args else None)


def wrap_stat_logger_init(original, hook: str):
    def __init__(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        with runtime.guard(hook) as rt:
            if rt is not None:
                _note(_config_arg(args, kwargs), engine=False)
                indexes = kwargs.get("engine_indexes", args[1] if len(args) > 1 else None) or [0]
                if len(indexes) == 1:  # one engine behind this API server: its index joins too
                    exposition.PROCESS_LABELS["engine"] = str(indexes[0])
        return result

    return __init__


def wrap_engine_init(original, hook: str):
    def __init__(self, *args, **kwargs):
        with runtime.guard(hook) as rt:
            if rt is not None:
                _note(_config_arg(args, kwargs), engine=True)
        return original(self, *args, **kwargs)

    return __init__


def wrap_llm_engine_from_engine_args(original, hook: str):
    """The offline engine's standalone endpoint. Not ``LLM.__init__``: vLLM loads the plugin from
    inside it (``EngineArgs.__post_init__``), so a wrapper there misses a process's first engine;
    ``LLMEngine.from_engine_args`` runs right after, for every offline engine."""

    def from_engine_args(cls, *args, **kwargs):
        with runtime.guard(hook) as rt:
            if rt is not None and "prometheus" in rt.settings.exporters and not _api_server:
                exposition.serve_standalone(
                    exposition.server_dir(rt.settings.metrics_dir),
                    rt.settings.prometheus_host,
                    rt.settings.prometheus_port,
                    on_error=_count("offline.collect"),
                )
        return original(cls, *args, **kwargs)

    return from_engine_args


def serve_headless_node() -> None:
    """The standalone endpoint of a headless node's launcher (called inside the frontend hook's guard)."""
    rt = _enabled()
    if rt is not None and not _api_server:
        exposition.serve_standalone(
            exposition.server_dir(rt.settings.metrics_dir),
            rt.settings.prometheus_host,
            rt.settings.prometheus_port,
            on_error=_count("headless.collect"),
            what="headless node",
        )


HOOKS = [
    Hook("api_server.metrics_registry", "vllm.entrypoints.serve.instrumentator.metrics:get_prometheus_registry",
         wrap_get_prometheus_registry, within="vllm.entrypoints.serve.instrumentator.metrics:attach_router"),
    Hook(
        "api_server.multiprocess_registry",
        "prometheus_client.multiprocess:MultiProcessCollector.__init__",
        wrap_multiprocess_collector_init,
    ),
    Hook("labels.frontend", "vllm.v1.metrics.loggers:PrometheusStatLogger.__init__", wrap_stat_logger_init),
    Hook("labels.engine_core", "vllm.v1.core.sched.scheduler:Scheduler.__init__", wrap_engine_init),
    Hook("labels.worker", "vllm.v1.worker.gpu_worker:Worker.__init__", wrap_engine_init),
    Hook("offline.prometheus_endpoint", "vllm.v1.engine.llm_engine:LLMEngine.from_engine_args", wrap_llm_engine_from_engine_args),
]
