"""The trained zoo: a small Qwen3 target and the drafters speculators trained for it.

``spectrace/testing/zoo/`` holds what ``make zoo`` (``tools/zoo.py``) wrote: ``target/``
(a 4-layer, hidden-128 Qwen3ForCausalLM trained on the synthetic corpus of
``spectrace/testing/zoo_corpus.py``, with its tokenizer), ``dflash/`` and ``eagle3/`` (speculators-format
checkpoints as speculators' trainer saved them, loaded by vLLM as they are) and
``manifest.json`` (sha256 of every file, the seeds, the settings, the build's seconds).

Unlike :mod:`spectrace.testing.models` (random weights), these drafters accept for real, so a
finding's claimed cost can be checked against a real drop in acceptance.

:func:`dflash_declared` writes the trained DFlash drafter again as a plain
``DFlashDraftModel`` directory whose config declares its window one of two ways:

- ``"as-shipped"``: ``sliding_window`` with no ``use_sliding_window`` and no ``layer_types``,
  as the seed's drafter did: transformers' Qwen3Config drops the window and derives every
  layer as full attention, so the drafter attends to the whole context it was never trained
  to see;
- ``"fixed"``: ``layer_types``, ``sliding_window`` and ``use_sliding_window: true``: its
  layer slides, as it did in training.

Nothing here imports torch or vLLM (the weights are copied, not loaded).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

ZOO = Path(__file__).parent / "zoo"
MANIFEST = ZOO / "manifest.json"
DECLARATIONS = ("as-shipped", "fixed")


def manifest() -> dict[str, Any]:
    return json.loads(MANIFEST.read_text())


def paths() -> dict[str, str]:
    """``target``, ``dflash``, ``eagle3``: the committed model directories."""
    return {name: str(ZOO / name) for name in ("target", "dflash", "eagle3")}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def window() -> int:
    """The sliding window the DFlash drafter was trained with."""
    config = json.loads((ZOO / "dflash" / "config.json").read_text())
    return int(config["transformer_layer_config"]["sliding_window"])


def declared_fields(declaration: str) -> dict[str, Any]:
    """The window fields of each declaration (what the demo prints)."""
    w = window()
    if declaration == "as-shipped":
        return {"sliding_window": w}
    if declaration == "fixed":
        return {"layer_types": ["sliding_attention"], "sliding_window": w, "use_sliding_window": True}
    raise ValueError(f"declaration must be one of {DECLARATIONS}, got {declaration!r}")


def dflash_declared(out_dir: str | Path, declaration: str, *, rope_theta: float | None = None) -> Path:
    """The trained DFlash drafter as a plain ``DFlashDraftModel`` directory (see module doc).

    Everything but the window fields is what vLLM's speculators loader would make of the
    checkpoint: the layer shape from ``transformer_layer_config``, ``dflash_config`` with the
    mask token, ``target_layer_ids`` (the taps minus one, vLLM's DFlash indexing) and
    ``causal: true`` (speculators trains causal sliding layers), so the two declarations differ
    in their window fields alone. ``rope_theta``: a RoPE base other than the one it was trained
    with (and the target runs), as a config copied from another model declares one.
    """
    source = json.loads((ZOO / "dflash" / "config.json").read_text())
    layer = dict(source["transformer_layer_config"])
    for key in ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers"):
        layer.pop(key, None)
    config = {
        **layer,
        "architectures": ["DFlashDraftModel"],
        "dtype": "float32",
        "draft_vocab_size": source.get("draft_vocab_size"),
        "dflash_config": {
            "mask_token_id": source["mask_token_id"],
            "target_layer_ids": [i - 1 for i in source["aux_hidden_state_layer_ids"]],
            "causal": not source.get("sliding_window_non_causal", False),
            "sample_from_anchor": bool(source.get("sample_from_anchor", False)),
        },
        **declared_fields(declaration),
    }
    if rope_theta is not None:
        config["rope_parameters"] = {**config["rope_parameters"], "rope_theta": rope_theta}
    target = json.loads((ZOO / "target" / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        config[key] = target.get(key)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(ZOO / "dflash" / "model.safetensors", out / "model.safetensors")
    return out


def prompts(n: int, min_chars: int, seed: int = 7) -> list[str]:
    """Held-out prompts from the zoo's corpus generator (a seed the training never used)."""
    from spectrace.testing.zoo_corpus import prompts as corpus_prompts

    return corpus_prompts(seed, n, min_chars)


# -- the EAGLE-3 drafter, served right and served wrong ----------------------------------------------------------------

EAGLE3_VARIANTS = ("trained", "vocab-mapped", "d2t-missing", "rope-theta", "norm-nested", "specforge", "specforge-fixed")
# the top-level fields speculators' EAGLE-3 updater hands vLLM (vllm/transformers_utils/configs/speculators/algos.py
# update_eagle3), which an HF-layout drafter declares itself
_EAGLE3_TOP_LEVEL = ("draft_vocab_size", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def _read_safetensors(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    return header, raw[8 + n:]


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """``{name: (dtype, shape, little-endian bytes)}`` as a safetensors file (no torch)."""
    header: dict[str, Any] = {}
    data = bytearray()
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data))


def draft_vocabulary() -> list[int]:
    """The target ids the drafter-data corpus uses (each document alone, and documents joined as prompts join
    them), ascending: a reduced draft vocabulary as speculators builds one from its training data."""
    from tokenizers import Tokenizer

    from spectrace.testing.zoo_corpus import documents

    tokenizer = Tokenizer.from_file(str(ZOO / "target" / "tokenizer.json"))
    docs = documents(manifest()["seeds"]["drafter_data"], 2000)
    ids = set(tokenizer.encode("\n\n".join(docs)).ids)
    for doc in docs:
        ids.update(tokenizer.encode(doc).ids)
    return sorted(ids)


def eagle3_variant(out_dir: str | Path, variant: str) -> Path:
    """The trained EAGLE-3 drafter as it was saved, or with one thing wrong (a speculators-format directory).

    - ``trained``: as speculators saved it (full vocabulary, no ``d2t``);
    - ``vocab-mapped``: the same drafter with a reduced draft vocabulary (:func:`draft_vocabulary`): the lm_head
      rows of those ids, ``d2t`` (offsets) and ``t2d`` (mask) as speculators writes them;
    - ``d2t-missing``: ``vocab-mapped`` without its ``d2t``/``t2d`` tensors;
    - ``rope-theta``: the drafter's ``rope_theta`` 100× the target's (and its training's);
    - ``norm-nested``: ``norm_before_fc`` moved into ``transformer_layer_config``;
    - ``specforge``: the same weights in SpecForge's HF layout (``LlamaForCausalLMEagle3``, the layer's fields at the
      top level), its taps nested in ``eagle_config`` in SGLang's convention (id L: the output of layer L), so the
      ids 1 less than the vLLM taps it was trained on (#58);
    - ``specforge-fixed``: that layout with its taps declared as doctor's fix says (top-level vLLM ids).
    """
    if variant not in EAGLE3_VARIANTS:
        raise ValueError(f"variant must be one of {EAGLE3_VARIANTS}, got {variant!r}")
    source = ZOO / "eagle3"
    config = json.loads((source / "config.json").read_text())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header, data = _read_safetensors(source / "model.safetensors")
    tensors = {name: (h["dtype"], h["shape"], data[h["data_offsets"][0]:h["data_offsets"][1]])
               for name, h in header.items() if name != "__metadata__"}
    layer = config["transformer_layer_config"]
    if variant in ("vocab-mapped", "d2t-missing"):
        keep = draft_vocabulary()
        dtype, (vocab, hidden), blob = tensors["lm_head.weight"]
        row = len(blob) // vocab
        tensors["lm_head.weight"] = (dtype, [len(keep), hidden], b"".join(blob[i * row:(i + 1) * row] for i in keep))
        config["draft_vocab_size"] = len(keep)
        if variant == "vocab-mapped":
            tensors["d2t"] = ("I64", [len(keep)], b"".join((t - d).to_bytes(8, "little", signed=True)
                                                          for d, t in enumerate(keep)))
            kept = set(keep)
            tensors["t2d"] = ("BOOL", [vocab], bytes(int(i in kept) for i in range(vocab)))
    elif variant == "rope-theta":
        layer["rope_parameters"] = {**layer["rope_parameters"], "rope_theta": layer["rope_parameters"]["rope_theta"] * 100}
    elif variant == "norm-nested":
        layer["norm_before_fc"] = config.pop("norm_before_fc")
    if variant in ("specforge", "specforge-fixed"):
        taps = config["eagle_aux_hidden_state_layer_ids"]
        config = {**layer, **{key: config[key] for key in _EAGLE3_TOP_LEVEL if config.get(key) is not None},
                  "architectures": ["LlamaForCausalLMEagle3"]}
        if variant == "specforge":
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in taps]}
        else:
            config["eagle_aux_hidden_state_layer_ids"] = list(taps)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    _write_safetensors(out / "model.safetensors", tensors)
    return out
