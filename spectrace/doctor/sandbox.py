"""The sandbox doctor runs vLLM in: process-wide switches for a dry build, each one restored.

- ``quiet``: vLLM and transformers below ERROR go nowhere, the plugin stays idle,
  nothing is fetched from a hub;
- ``runner_rules``: the installed vLLM applies model runner V1's or V2's rules;
- ``capture_get_config``: every ``get_config`` call of config resolution is noted
  (the live frontend hook's site);
- ``single_process_group``: a world-size-1 gloo group over a temporary file, as
  model builds need;
- ``build_on_meta``: a model built on the meta device (no memory, no weights), with
  the config and prefix the model runner builds it with (``draft_build_config``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from typing import Any, Iterator

from spectrace.vllm_objects.configs import ConfigCapture

_QUIET_LOGGERS = ("vllm", "transformers", "torch", "huggingface_hub", "filelock", "urllib3")


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
    A vLLM with one runner (0.34 on: V2 only, no ``use_v2_model_runner``) applies its own rules as they are.
    """
    import vllm.config.vllm as vllm_config_module
    from vllm.config import VllmConfig

    if "use_v2_model_runner" not in VllmConfig.__dict__:
        yield
        return
    use_v2 = runner == "v2"
    saved_property = VllmConfig.__dict__["use_v2_model_runner"]
    saved_triton = getattr(vllm_config_module, "HAS_TRITON", None)
    VllmConfig.use_v2_model_runner = property(lambda self: use_v2)
    if use_v2 and saved_triton is not None:
        vllm_config_module.HAS_TRITON = True
    try:
        yield
    finally:
        VllmConfig.use_v2_model_runner = saved_property
        if saved_triton is not None:
            vllm_config_module.HAS_TRITON = saved_triton


def runners() -> tuple[str, ...]:
    """The model runners the installed vLLM has: both through 0.33, only V2 from 0.34 (its V1 runner is gone)."""
    from vllm.config import VllmConfig

    return ("v1", "v2") if "use_v2_model_runner" in VllmConfig.__dict__ else ("v2",)


@contextlib.contextmanager
def capture_get_config(captures: list[ConfigCapture]) -> Iterator[None]:
    """Note every ``get_config`` call of config resolution (the live hook's site)."""
    import vllm.config.model as model_module

    original = model_module.get_config

    def get_config(model, *args, **kwargs):
        try:
            config = original(model, *args, **kwargs)
        except BaseException as exc:
            captures.append(ConfigCapture(str(model), error=f"{type(exc).__name__}: {exc}"))
            raise
        captures.append(ConfigCapture(str(model), config=config))
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


def build_on_meta(vllm_config: Any, model_config: Any, prefix: str = "") -> Any:
    import torch
    from vllm.model_executor.model_loader.utils import initialize_model

    with torch.device("meta"):
        return initialize_model(vllm_config, model_config=model_config, prefix=prefix)


def draft_build_config(vllm_config: Any) -> tuple[Any, str]:
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


# safetensors header dtype -> torch dtype, for the meta tensors a dry load feeds vLLM
_HEADER_DTYPES = {
    "BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


def dry_load(model: Any, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> set[str]:
    """The parameter names vLLM's own ``load_weights`` fills from a checkpoint of ``tensors``,
    run on the meta-built ``model`` with meta tensors of the manifest's shapes (no data read).

    As the live hook (``spectrace.recorder.weights``): the set ``AutoWeightsLoader.load_weights``
    returns for the whole model, else what the model's ``load_weights`` returns. Raises what the
    model's loader raises (a shape it refuses, a loader that needs data).
    """
    import torch
    from vllm.model_executor.models import utils as model_utils

    loader_class = model_utils.AutoWeightsLoader
    original = loader_class.__dict__["load_weights"]
    filled: set[str] = set()

    def capture(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if self.module is model and isinstance(result, set):
            filled.update(result)
        return result

    def weights():
        for name, (dtype, shape) in tensors.items():
            yield name, torch.empty(shape, dtype=getattr(torch, _HEADER_DTYPES.get(dtype, "float32")), device="meta")

    loader_class.load_weights = capture
    try:
        with torch.device("meta"):
            returned = model.load_weights(weights())
    finally:
        loader_class.load_weights = original
    return filled or (set(returned) if isinstance(returned, set) else set())


def shared_modules(model: Any, method: str | None) -> dict[str, str | None]:
    """Whether vLLM will give the drafter the target's ``embed_tokens`` / ``lm_head``, as far as a
    dry load can tell (``SpecDecodeBaseProposer._maybe_share_*``: EAGLE-style drafters by the
    ``has_own_*`` flags their load sets, MTP always, ``draft_model`` never; the live run's weight
    equality test cannot be made without data, so a drafter with its own copy reads "own")."""
    if method == "draft_model":
        return {}
    found: dict[str, str | None] = {}
    for module, flag in (("embed_tokens", "has_own_embed_tokens"), ("lm_head", "has_own_lm_head")):
        own = getattr(model, flag, None)
        found[module] = "target" if own is None or own is False else "own"
    return found
