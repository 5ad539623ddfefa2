"""What every tiny test model is written with: the shared shape (hidden 128, 4 heads / 2 KV heads, head_dim 32,
vocab 512, float32), seeded random weights, safetensors checkpoints and ``config.json`` files, and the locally trained
byte-level BPE tokenizer. ``spectrace.testing.models`` builds the models (and the test zoo) from these."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 32
VOCAB_SIZE = 512
RMS_NORM_EPS = 1e-6
WEIGHT_STD = 0.2

EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|bos|>"
PAD_TOKEN = "<|pad|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = (EOS_TOKEN, BOS_TOKEN, PAD_TOKEN, MASK_TOKEN)
# ``enable_thinking`` (a chat_template_kwargs key) renders the generation prompt as Qwen3's template does: an open
# think block when true, an empty closed one when false, nothing when the key is absent
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined %}{% if enable_thinking %}<think>\n{% else %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}{% endif %}"
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)

WORDS = (
    "the a an of to in is was for on that with as by at from it this be are or not but "
    "have has had which one all were they their there been more when will would who so "
    "if out no up what about into than them can only other new some could time these two "
    "may then do first any my now such like our over man me even most made after also did "
    "many before must through back years where much your way well down should because "
    "each just those people how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three "
    "draft token accept reject verify speculative decode model layer hidden state target"
).split()


# --------------------------------------------------------------------------- helpers


def tokenizer_corpus() -> list[str]:
    """Deterministic English-like training text for the BPE tokenizer."""
    rng = random.Random(0)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))) + rng.choice(".,!?")
        for _ in range(3000)
    ]


def special_ids(tokenizer_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Ids of the special tokens, read from a saved ``tokenizer.json``."""
    data = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    by_content = {tok["content"]: tok["id"] for tok in data.get("added_tokens", [])}
    ids = {
        "eos_token_id": by_content.get(EOS_TOKEN),
        "bos_token_id": by_content.get(BOS_TOKEN),
        "pad_token_id": by_content.get(PAD_TOKEN),
        "mask_token_id": by_content.get(MASK_TOKEN),
    }
    return {key: value for key, value in ids.items() if value is not None}


def copy_tokenizer(src: str | os.PathLike[str], dst: Path) -> None:
    """Copy the tokenizer files of ``src`` (a tokenizer or model dir) into ``dst``."""
    for name in TOKENIZER_FILES:
        path = Path(src) / name
        if path.is_file():
            shutil.copyfile(path, dst / name)


def random_tensors(shapes: Mapping[str, Sequence[int]], seed: int) -> dict[str, torch.Tensor]:
    """Seeded float32 weights: norms are ones, everything else ~ N(0, WEIGHT_STD)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.float32)
        else:
            out[name] = torch.randn(shape, generator=gen, dtype=torch.float32) * WEIGHT_STD
    return out


def decoder_layer_shapes(
    prefix: str, *, qkv_in: int = HIDDEN_SIZE, qk_norm: bool = True, qkv_bias: bool = False
) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of one Llama/Qwen decoder layer under ``prefix``."""
    q, kv = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    shapes: dict[str, tuple[int, ...]] = {
        f"{prefix}.self_attn.q_proj.weight": (q, qkv_in),
        f"{prefix}.self_attn.k_proj.weight": (kv, qkv_in),
        f"{prefix}.self_attn.v_proj.weight": (kv, qkv_in),
        f"{prefix}.self_attn.o_proj.weight": (HIDDEN_SIZE, q),
        f"{prefix}.mlp.gate_proj.weight": (INTERMEDIATE_SIZE, HIDDEN_SIZE),
        f"{prefix}.mlp.up_proj.weight": (INTERMEDIATE_SIZE, HIDDEN_SIZE),
        f"{prefix}.mlp.down_proj.weight": (HIDDEN_SIZE, INTERMEDIATE_SIZE),
        f"{prefix}.input_layernorm.weight": (HIDDEN_SIZE,),
        f"{prefix}.post_attention_layernorm.weight": (HIDDEN_SIZE,),
    }
    if qk_norm:
        shapes[f"{prefix}.self_attn.q_norm.weight"] = (HEAD_DIM,)
        shapes[f"{prefix}.self_attn.k_norm.weight"] = (HEAD_DIM,)
    if qkv_bias:
        shapes[f"{prefix}.self_attn.q_proj.bias"] = (q,)
        shapes[f"{prefix}.self_attn.k_proj.bias"] = (kv,)
        shapes[f"{prefix}.self_attn.v_proj.bias"] = (kv,)
    return shapes


def write_checkpoint(
    out_dir: str | os.PathLike[str],
    config: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    *,
    tokenizer_src: str | os.PathLike[str],
) -> Path:
    """Write ``config.json`` exactly as given, ``model.safetensors`` and the tokenizer."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dict(config), indent=2, sort_keys=True) + "\n")
    save_file(
        {name: t.contiguous() for name, t in tensors.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    copy_tokenizer(tokenizer_src, out)
    return out


def save_causal_lm(
    out_dir: str | os.PathLike[str],
    config: Any,
    *,
    seed: int,
    tokenizer_dir: str | os.PathLike[str],
    zero: Iterable[str] = (),
    extra_shapes: Mapping[str, Sequence[int]] | None = None,
) -> Path:
    """Build a transformers model from ``config``, fill it with seeded random weights
    (``zero`` names set to 0; ``extra_shapes`` adds tensors the HF class lacks) and
    ``save_pretrained`` it together with the tokenizer."""
    from transformers import AutoModelForCausalLM

    architectures = list(config.architectures or [])  # save_pretrained overwrites it
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    shapes.update(extra_shapes or {})
    state = random_tensors(shapes, seed)
    for name in zero:
        state[name].zero_()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_progress():
        model.save_pretrained(out, state_dict=state)
    # save_pretrained writes the Python class name (e.g. Qwen2ForCausalLM) as the
    # architecture; keep the one the config declares (e.g. MiMoForCausalLM).
    if architectures:
        saved = json.loads((out / "config.json").read_text())
        saved["architectures"] = architectures
        (out / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    copy_tokenizer(tokenizer_dir, out)
    return out


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Silence transformers' "Writing model shards" progress bar for one save."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def base_config(tokenizer_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The shared tiny shape plus the tokenizer's special token ids."""
    ids = special_ids(tokenizer_dir)
    ids.pop("mask_token_id", None)
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "rms_norm_eps": RMS_NORM_EPS,
        "tie_word_embeddings": False,
        **ids,
    }


def draft_config(target_dir: str | os.PathLike[str], **fields: Any) -> dict[str, Any]:
    """A hand-written drafter config: the target's shape, rope and ids plus ``fields``.

    Only the keys listed here and in ``fields`` are written: no derived defaults
    (``layer_types``, ``sliding_window``, ``use_sliding_window``...) are added.
    """
    target = json.loads((Path(target_dir) / "config.json").read_text())
    keys = (
        "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
        "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
        "max_position_embeddings", "rope_parameters", "bos_token_id", "eos_token_id",
        "pad_token_id",
    )  # fmt: skip
    config = {key: target[key] for key in keys if target.get(key) is not None}
    config.update(tie_word_embeddings=False, attention_bias=False, dtype="float32")
    config.update(fields)
    return config


def merge_config(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge ``extra`` into ``base`` (nested dicts are merged, not replaced)."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge_config(base[key], value)
        else:
            base[key] = value
    return base


def not_none(**items: Any) -> dict[str, Any]:
    return {key: value for key, value in items.items() if value is not None}


# -------------------------------------------------------------------------- the tokenizer


def train_byte_bpe(corpus: Iterable[str], vocab_size: int, special: Sequence[str]):
    """A deterministic byte-level BPE ``tokenizers.Tokenizer`` of exactly ``vocab_size`` ids trained on
    ``corpus``, the ``special`` tokens taking the last ids (the test zoo's and the trained zoo's, tools/zoo.py)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens(list(special))
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, want {vocab_size}")
    return tok


def build_tokenizer(out_dir: str | os.PathLike[str]) -> Path:
    """Train a deterministic 512-token byte-level BPE and save it as a
    ``PreTrainedTokenizerFast`` (special tokens eos/bos/pad/mask take ids 508-511,
    so id 0 is an ordinary token)."""
    from transformers import PreTrainedTokenizerFast

    tok = train_byte_bpe(tokenizer_corpus(), VOCAB_SIZE, SPECIAL_TOKENS)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        model_max_length=2048,
        chat_template=CHAT_TEMPLATE,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(out)
    return out
