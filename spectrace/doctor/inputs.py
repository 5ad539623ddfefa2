"""What doctor takes in, checked before transformers or vLLM see it: the two ``config.json`` files (size, nesting
and layer counts bounded), the numbers given on the command line, a speculators-format drafter's type, and the
speculative methods the installed vLLM builds a draft model for. Bad input is a :class:`DoctorInputError`: one
line, never a traceback (``spectrace doctor`` exits 2 on it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from spectrace.audit import MODEL_FREE_METHODS


class DoctorInputError(Exception):
    """Bad input: a missing path, an unreadable or invalid config.json, an unknown option value."""


# What doctor hands to transformers and vLLM, bounded first: a config.json is input from anyone.
MAX_CONFIG_BYTES = 4 << 20  # real configs are a few kB; multimodal ones tens of kB
MAX_NESTING = 32  # objects and lists inside one another
MAX_LAYERS = 4096  # any *layers count (num_hidden_layers, text_config.num_hidden_layers, ...), layer_types' length


def _depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (lists and objects), counted up to ``limit + 1``."""
    depth, level = 0, [value]
    while level and depth <= limit:
        children = []
        for item in level:
            if isinstance(item, dict):
                children.extend(item.values())
            elif isinstance(item, list):
                children.extend(item)
        if not children:
            break
        depth += 1
        level = children
    return depth


def _check_bounds(data: dict[str, Any], file: Path) -> None:
    """Refuse what would make transformers or vLLM run away (memory, time) or fail with a traceback."""
    if _depth(data, MAX_NESTING) > MAX_NESTING:
        raise DoctorInputError(f"{file} nests deeper than {MAX_NESTING} levels: not a model config")
    stack = [("", data)]
    while stack:
        prefix, obj = stack.pop()
        for key, value in obj.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                stack.append((f"{name}.", value))
            elif key.endswith("layers") and key.startswith(("num_", "n_")) and not isinstance(value, bool) and isinstance(value, (int, float)):
                if not 0 <= value <= MAX_LAYERS:
                    raise DoctorInputError(f"{file}: {name}={value!r} is outside 0..{MAX_LAYERS}")
            elif key == "layer_types" and isinstance(value, list) and len(value) > MAX_LAYERS:
                raise DoctorInputError(f"{file}: layer_types has {len(value)} entries (more than {MAX_LAYERS})")
    architectures = data.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(a, str) and a for a in architectures)
    ):
        raise DoctorInputError(f"{file}: architectures must be a list of class names, got {architectures!r:.80}")


def load_declared(path: str, role: str) -> dict[str, Any]:
    """The ``config.json`` of a local model directory, as written (size, nesting and layer counts bounded)."""
    directory = Path(path)
    if not directory.exists():
        raise DoctorInputError(f"{role} path {path!r} does not exist")
    if not directory.is_dir():
        raise DoctorInputError(f"{role} path {path!r} is not a directory (give the model directory)")
    file = directory / "config.json"
    if not file.is_file():
        raise DoctorInputError(f"{role} directory {path!r} has no config.json")
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise DoctorInputError(f"{file} is larger than {MAX_CONFIG_BYTES >> 20} MB: not a model config")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DoctorInputError(f"cannot read {file}: {exc.__class__.__name__}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DoctorInputError(f"{file} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise DoctorInputError(f"{file} nests deeper than {MAX_NESTING} levels: not a model config") from None
    if not isinstance(data, dict):
        raise DoctorInputError(f"{file} must hold a JSON object, not {type(data).__name__}")
    _check_bounds(data, file)
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


# --speculative-config: the keys doctor's own options give, and a bound on the text
_SPECULATIVE_OWN = {"model": "--draft", "method": "--method", "num_speculative_tokens": "--num-speculative-tokens"}
MAX_SPECULATIVE_BYTES = 64 << 10


def speculative_extra(value: Any) -> dict[str, Any]:
    """``--speculative-config JSON``: further keys of vLLM's --speculative-config (e.g. "rejection_sample_method"),
    a JSON object without the keys doctor's own options give. What vLLM then refuses is a finding."""
    if value is None:
        return {}
    if isinstance(value, dict):
        extra = value
    else:
        text = str(value)
        if len(text.encode("utf-8", "replace")) > MAX_SPECULATIVE_BYTES:
            raise DoctorInputError(f"--speculative-config is over {MAX_SPECULATIVE_BYTES} bytes")
        try:
            extra = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise DoctorInputError(f"--speculative-config is not JSON: {str(exc)[:120]}") from None
    if not isinstance(extra, dict):
        raise DoctorInputError(f"--speculative-config must be a JSON object, got {type(extra).__name__}")
    if _depth(extra, MAX_NESTING) > MAX_NESTING:
        raise DoctorInputError(f"--speculative-config nests deeper than {MAX_NESTING} levels")
    own = [key for key in extra if key in _SPECULATIVE_OWN]
    if own:
        raise DoctorInputError(f"--speculative-config: give {own[0]!r} with {_SPECULATIVE_OWN[own[0]]}")
    return extra


def _check_speculators(config: dict[str, Any], path: str) -> None:
    """A speculators-format drafter (``speculators_model_type``) must name a type the installed vLLM converts
    and keep its decoder layer's config in an object: one line each, before vLLM sees it."""
    if "speculators_model_type" not in config and "speculators_config" not in config:
        return
    layer = config.get("transformer_layer_config")
    if layer is not None and not isinstance(layer, dict):
        raise DoctorInputError(
            f"{path}/config.json: transformer_layer_config must be an object (the drafter's decoder layer config), "
            f"got {type(layer).__name__}"
        )
    try:
        from vllm.transformers_utils.configs.speculators.algos import SUPPORTED_SPECULATORS_TYPES
    except ImportError:
        return
    kind = config.get("speculators_model_type")
    if kind not in SUPPORTED_SPECULATORS_TYPES:
        raise DoctorInputError(
            f"{path}/config.json: speculators_model_type {str(kind)[:40]!r} is not one this vLLM converts "
            f"(choose from {', '.join(sorted(SUPPORTED_SPECULATORS_TYPES))})"
        )


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

    return sorted({m for m in flatten(SpeculativeMethod) if m not in MODEL_FREE_METHODS})
