"""A model's weights as plain data: the safetensors manifest, and what vLLM's loader filled.

The manifest is read from the safetensors *headers* only (an 8-byte little-endian length, then
that many bytes of JSON: each tensor's dtype, shape and byte offsets); no tensor data is read.
A checkpoint is input from anyone, so the header length is bounded, the JSON checked, the number
of files and tensors bounded, and any problem is the manifest's ``error`` (never an exception into
vLLM or a traceback in ``doctor``). Cost: one ``open`` + two reads per file (a few kB for a small
model, a few hundred kB for a large one).

What the loader filled is the set of parameter names ``AutoWeightsLoader.load_weights`` returns
for the model being loaded (captured by ``spectrace.recorder.weights`` while vLLM's
``DefaultModelLoader.load_weights`` runs), copied before vLLM's own check adds its exempt names.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit (100 MB)
MAX_FILES = 4096
MAX_TENSORS = 1_000_000
INDEX = "model.safetensors.index.json"


@dataclass
class Manifest:
    """One checkpoint's tensors from its safetensors headers: name -> (dtype, shape)."""

    files: list[str] = field(default_factory=list)
    tensors: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    header_bytes: int = 0
    error: str | None = None

    def dtypes(self) -> dict[str, int]:
        return dict(Counter(dtype for dtype, _ in self.tensors.values()).most_common())

    def main_dtype(self) -> str | None:
        """The dtype most of its floating tensors hold (``BF16``, ``F16``, ``F32``)."""
        floating = Counter(d for d, _ in self.tensors.values() if d in ("BF16", "F16", "F32", "F64"))
        return floating.most_common(1)[0][0] if floating else None

    def summary(self) -> dict[str, Any]:
        return {
            "files": len(self.files),
            "tensors": len(self.tensors),
            "dtypes": self.dtypes(),
            "header_bytes": self.header_bytes,
            "error": self.error,
        }


class ManifestError(ValueError):
    pass


def read_header(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], int]:
    """The tensors one safetensors file declares, and its header's size. Raises :class:`ManifestError`."""
    try:
        with open(path, "rb") as handle:
            size = path.stat().st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ManifestError(f"{path.name}: shorter than a safetensors header")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or length > size - 8:
                raise ManifestError(f"{path.name}: header length {length} exceeds the file or {MAX_HEADER_BYTES} bytes")
            raw = handle.read(length)
    except OSError as exc:
        raise ManifestError(f"{path.name}: {type(exc).__name__}: {exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ManifestError(f"{path.name}: header is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ManifestError(f"{path.name}: header is not a JSON object")
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ManifestError(f"{path.name}: entry {name[:80]!r} is not an object")
        dtype, shape = entry.get("dtype"), entry.get("shape")
        if not isinstance(dtype, str) or not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ManifestError(f"{path.name}: entry {name[:80]!r} has no valid dtype and shape")
        tensors[name] = (dtype, tuple(shape))
    return tensors, length


def _model_dir(model: str) -> Path | None:
    path = Path(model)
    if path.is_dir():
        return path
    try:  # a hub id already in the local cache; nothing is downloaded
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True, allow_patterns=["*.json", "*.safetensors"]))
    except Exception:
        return None


def read_manifest(model: str | Path) -> Manifest:
    """The manifest of a model directory (or cached hub id): every ``*.safetensors`` header it holds."""
    manifest = Manifest()
    directory = _model_dir(str(model))
    if directory is None:
        manifest.error = f"{model}: not a local model directory"
        return manifest
    files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    if not files:
        manifest.error = f"{directory}: no *.safetensors files"
        return manifest
    if len(files) > MAX_FILES:
        manifest.error = f"{directory}: more than {MAX_FILES} safetensors files"
        return manifest
    for file in files:
        try:
            tensors, length = read_header(file)
        except ManifestError as exc:
            manifest.error = str(exc)
            return manifest
        manifest.files.append(file.name)
        manifest.header_bytes += length + 8
        manifest.tensors.update(tensors)
        if len(manifest.tensors) > MAX_TENSORS:
            manifest.error = f"{directory}: more than {MAX_TENSORS} tensors"
            return manifest
    return manifest


# -- the vocabulary map (d2t / t2d): small tensors whose values are read ---------------------

MAX_MAP_ELEMENTS = 1 << 22  # a t2d over a 262k-token vocabulary is 262k bytes; 4M elements bounds any real one
VOCAB_MAP_TENSORS = ("d2t", "t2d")
_NUMPY_DTYPES = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "U16": "<u2", "U32": "<u4", "BOOL": "?"}


def _map_names(names: Any) -> dict[str, str]:
    """The checkpoint names of the map tensors (``d2t``, or a prefixed ``model.d2t``), shortest first."""
    found: dict[str, str] = {}
    for name in sorted(names, key=len):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in VOCAB_MAP_TENSORS:
            found.setdefault(leaf, name)
    return found


def read_vocab_maps(model: str | Path) -> tuple[bool, dict[str, Any]]:
    """(checkpoint read, ``{"d2t": VocabTensor, "t2d": VocabTensor}`` for those present) of a model directory.

    The header gives each map's dtype and shape; its values are read from the file's data section when the
    dtype is an integer or boolean one and it holds at most ``MAX_MAP_ELEMENTS`` (else ``error`` says why).
    Never raises: an unreadable checkpoint reads as not read.
    """
    from spectrace.readings import VocabTensor

    manifest = read_manifest(model)
    if manifest.error is not None:
        return False, {}
    names = _map_names(manifest.tensors)
    found: dict[str, Any] = {}
    if not names:
        return True, found
    directory = _model_dir(str(model))
    for leaf, name in names.items():
        dtype, shape = manifest.tensors[name]
        tensor = VocabTensor(dtype, shape)
        try:
            tensor.values = _read_values(directory, name, dtype, shape)
        except (ManifestError, OSError, ValueError) as exc:
            tensor.error = str(exc)[:200]
        found[leaf] = tensor
    return True, found


def _read_values(directory: Path | None, name: str, dtype: str, shape: tuple[int, ...]) -> list[int] | None:
    import numpy

    count = 1
    for d in shape:
        count *= d
    if dtype not in _NUMPY_DTYPES:
        raise ValueError(f"{name} is {dtype}: not read")
    if count > MAX_MAP_ELEMENTS:
        raise ValueError(f"{name} holds {count} elements (more than {MAX_MAP_ELEMENTS}): not read")
    if directory is None:
        return None
    for file in sorted(p for p in directory.glob("*.safetensors") if p.is_file()):
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > MAX_HEADER_BYTES:
                raise ManifestError(f"{file.name}: header too long")
            header = json.loads(handle.read(length).decode("utf-8"))
            entry = header.get(name)
            if not isinstance(entry, dict):
                continue
            start, end = entry.get("data_offsets", (None, None))
            item = numpy.dtype(_NUMPY_DTYPES[dtype]).itemsize
            if not (isinstance(start, int) and isinstance(end, int) and end - start == count * item and start >= 0):
                raise ManifestError(f"{file.name}: {name} has data offsets that do not fit its shape")
            handle.seek(8 + length + start)
            raw = handle.read(end - start)
            if len(raw) != end - start:
                raise ManifestError(f"{file.name}: {name} is cut short")
            return numpy.frombuffer(raw, dtype=_NUMPY_DTYPES[dtype]).astype("int64").tolist()
    return None

# -- the loaded model ------------------------------------------------------------------------


def parameter_names(model: Any) -> list[str] | None:
    try:
        return [name for name, _ in model.named_parameters()]
    except Exception:
        return None


def model_dtype(model: Any) -> str | None:
    """The dtype the built model's floating parameters hold (the first one's)."""
    try:
        for _, param in model.named_parameters():
            if param.dtype.is_floating_point:
                return str(param.dtype).removeprefix("torch.")
    except Exception:
        return None
    return None


def _inner(model: Any, name: str) -> Any:
    inner = getattr(model, "model", None)
    return getattr(inner, name, None) if inner is not None else None


def shared_with_target(draft: Any, target: Any) -> dict[str, str | None]:
    """Whether the drafter's ``embed_tokens`` and ``lm_head`` are its own or the target's module.

    vLLM decides per rank (``SpecDecodeBaseProposer._maybe_share_embeddings`` /
    ``_maybe_share_lm_head``: a flag, or ``torch.equal`` on the weights); this reads the outcome.
    """
    if draft is None or target is None:
        return {}
    target_inner = getattr(target, "get_language_model", None)
    try:
        language = target_inner() if callable(target_inner) else target
    except Exception:
        language = target
    found: dict[str, str | None] = {}
    draft_embed, target_embed = _inner(draft, "embed_tokens"), _inner(language, "embed_tokens")
    if draft_embed is not None:
        found["embed_tokens"] = "target" if draft_embed is target_embed else "own"
    draft_head, target_head = getattr(draft, "lm_head", None), getattr(language, "lm_head", None)
    if draft_head is not None:
        found["lm_head"] = "target" if draft_head is target_head else "own"
    return found


def inert_parameters(model: Any) -> set[str]:
    """Parameters the built model holds but never reads in this configuration, so nothing need load them.

    vLLM 0.32 ``qwen3_dflash.py``: ``model.mask_embedding`` (zeros) is used only when the checkpoint ships
    a separate mask embedding (``has_separate_mask_embedding``, set by ``load_weights``).
    """
    inert = set()
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "mask_embedding") and getattr(inner, "has_separate_mask_embedding", None) is False:
        inert.add("model.mask_embedding")
    return inert
