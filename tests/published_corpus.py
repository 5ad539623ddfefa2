"""Published drafter + target ``config.json`` pairs, as their sources publish them (issue #55).

Values are transcribed from the named file (data, not code): the drafters from the trainers' own repositories
(SpecForge ``configs/``, the EAGLE reference's training configs, speculators' trained checkpoints in the zoo), the
targets from their Hugging Face model cards' ``config.json``. Every pair is served correctly by vLLM as published:
``spectrace doctor`` must say nothing above info on any of them, under both model runners
(``tests/test_doctor_corpus.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

ZOO = Path(__file__).resolve().parents[1] / "spectrace" / "testing" / "zoo"

# -- targets ------------------------------------------------------------------------------------------------
# https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0",
    "use_cache": True, "vocab_size": 128256,
}  # fmt: skip
# https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct/blob/main/config.json
LLAMA_33_70B = {
    **LLAMA_31_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64, "num_hidden_layers": 80,
    "transformers_version": "4.47.0.dev0",
}  # fmt: skip
# https://huggingface.co/meta-llama/Llama-2-7b-chat-hf/blob/main/config.json
LLAMA_2_7B_CHAT = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.32.0.dev0", "use_cache": True, "vocab_size": 32000,
}  # fmt: skip
# https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}  # fmt: skip
# https://huggingface.co/Qwen/Qwen3-4B/blob/main/config.json
QWEN3_4B = {**QWEN3_8B, "hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True}
# https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json
QWEN3_32B = {**QWEN3_8B, "hidden_size": 5120, "intermediate_size": 25600, "max_window_layers": 64,
             "num_attention_heads": 64, "num_hidden_layers": 64}  # fmt: skip
# https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
}  # fmt: skip
# https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/blob/main/config.json
QWEN25_05B = {
    **QWEN25_7B, "hidden_size": 896, "intermediate_size": 4864, "max_window_layers": 21, "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "tie_word_embeddings": True, "vocab_size": 151936,
}  # fmt: skip



# -- drafters (SpecForge: https://github.com/sgl-project/SpecForge/tree/a6b6b02/configs, the drafters it trains) --
# SpecForge configs/llama3-8B-eagle3.json (the drafter for Llama-3.1-8B-Instruct): no rope_theta (10000, the
# drafter's own), max_position_embeddings 2048 (vLLM raises it: #48894), torch_dtype float16, no taps
SPECFORGE_LLAMA3_8B_EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 2048,
    "model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
    "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000,
}  # fmt: skip
# SpecForge configs/qwen3-8b-eagle3.json
SPECFORGE_QWEN3_8B_EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 1, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936, "draft_vocab_size": 32000,
}  # fmt: skip
# SpecForge configs/qwen3-4b-eagle3.json
SPECFORGE_QWEN3_4B_EAGLE3 = {**SPECFORGE_QWEN3_8B_EAGLE3, "hidden_size": 2560, "intermediate_size": 9728}
# SpecForge configs/qwen3-32b-eagle3.json
SPECFORGE_QWEN3_32B_EAGLE3 = {**SPECFORGE_QWEN3_8B_EAGLE3, "hidden_size": 5120, "intermediate_size": 25600,
                              "max_window_layers": 64, "num_attention_heads": 64}  # fmt: skip
# SpecForge configs/qwen2.5-7b-eagle3.json
SPECFORGE_QWEN25_7B_EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "llama",
    "num_attention_heads": 28, "num_hidden_layers": 1, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 152064, "draft_vocab_size": 16000,
}  # fmt: skip
# SpecForge configs/llama3-70B-ealge3.json (sic): llama3 scaling with original_max_position_embeddings 4096 where the
# target's is 8192, max_position_embeddings 4096
SPECFORGE_LLAMA3_70B_EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 8192, "initializer_range": 0.02, "intermediate_size": 28672,
    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 64, "num_key_value_heads": 8,
    "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 4096, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.28.1",
    "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000,
}  # fmt: skip
# SpecForge configs/qwen3-8b-dflash.json (z-lab's layout: z-lab/Qwen3-8B-DFlash-b16)
SPECFORGE_QWEN3_8B_DFLASH = {
    "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 16, "bos_token_id": 151643,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}, "dtype": "bfloat16",
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "layer_types": ["full_attention"] * 5, "max_position_embeddings": 40960,
    "max_window_layers": 5, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 5,
    "num_key_value_heads": 8, "num_target_layers": 36, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
# SpecForge configs/qwen3-4b-dflash.json
SPECFORGE_QWEN3_4B_DFLASH = {**SPECFORGE_QWEN3_8B_DFLASH, "hidden_size": 2560, "intermediate_size": 9728}
# SpecForge configs/qwen2.5-0.5b-dflash.json
SPECFORGE_QWEN25_05B_DFLASH = {
    **SPECFORGE_QWEN3_8B_DFLASH, "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 6, 11, 16, 21]},
    "head_dim": 64, "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "num_attention_heads": 14, "num_key_value_heads": 2, "num_target_layers": 24,
}  # fmt: skip
# https://github.com/SafeAILab/EAGLE/blob/cb7e084/eagle/traineagle3/config.json: the EAGLE-3 reference's drafter for
# Llama-3.1-8B-Instruct (published as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, architectures LlamaForCausalLMEagle3)
EAGLE3_REFERENCE_LLAMA31_8B = {
    **SPECFORGE_LLAMA3_8B_EAGLE3, "architectures": ["LlamaForCausalLMEagle3"],
}
# https://github.com/SafeAILab/EAGLE/blob/cb7e084/eagle/train/llama_2_chat_7B_config.json: EAGLE-1's drafter for
# Llama-2-7b-chat (yuhuili/EAGLE-llama2-chat-7B)
EAGLE1_REFERENCE_LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 1, "num_key_value_heads": 32, "pretraining_tp": 1,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.32.0.dev0", "use_cache": True, "vocab_size": 32000,
}  # fmt: skip

# name -> (method, target config, drafter config, source of the drafter)
PAIRS = {
    "specforge-llama3.1-8b-eagle3": ("eagle3", LLAMA_31_8B, SPECFORGE_LLAMA3_8B_EAGLE3, "SpecForge configs/llama3-8B-eagle3.json"),
    "specforge-qwen3-8b-eagle3": ("eagle3", QWEN3_8B, SPECFORGE_QWEN3_8B_EAGLE3, "SpecForge configs/qwen3-8b-eagle3.json"),
    "specforge-qwen3-4b-eagle3": ("eagle3", QWEN3_4B, SPECFORGE_QWEN3_4B_EAGLE3, "SpecForge configs/qwen3-4b-eagle3.json"),
    "specforge-qwen3-32b-eagle3": ("eagle3", QWEN3_32B, SPECFORGE_QWEN3_32B_EAGLE3, "SpecForge configs/qwen3-32b-eagle3.json"),
    "specforge-qwen2.5-7b-eagle3": ("eagle3", QWEN25_7B, SPECFORGE_QWEN25_7B_EAGLE3, "SpecForge configs/qwen2.5-7b-eagle3.json"),
    "specforge-llama3.3-70b-eagle3": ("eagle3", LLAMA_33_70B, SPECFORGE_LLAMA3_70B_EAGLE3, "SpecForge configs/llama3-70B-ealge3.json"),
    "specforge-qwen3-8b-dflash": ("dflash", QWEN3_8B, SPECFORGE_QWEN3_8B_DFLASH, "SpecForge configs/qwen3-8b-dflash.json"),
    "specforge-qwen3-4b-dflash": ("dflash", QWEN3_4B, SPECFORGE_QWEN3_4B_DFLASH, "SpecForge configs/qwen3-4b-dflash.json"),
    "specforge-qwen2.5-0.5b-dflash": ("dflash", QWEN25_05B, SPECFORGE_QWEN25_05B_DFLASH, "SpecForge configs/qwen2.5-0.5b-dflash.json"),
    "eagle3-reference-llama3.1-8b": ("eagle3", LLAMA_31_8B, EAGLE3_REFERENCE_LLAMA31_8B, "SafeAILab/EAGLE eagle/traineagle3/config.json"),
    "eagle1-reference-llama2-7b": ("eagle", LLAMA_2_7B_CHAT, EAGLE1_REFERENCE_LLAMA2_7B, "SafeAILab/EAGLE eagle/train/llama_2_chat_7B_config.json"),
}
# speculators' own format: the zoo's drafters, trained by speculators 0.9.0 for the zoo's target (spectrace/testing/zoo,
# `make zoo`), config.json as speculators wrote it
ZOO_PAIRS = {"speculators-zoo-dflash": ("dflash", "dflash"), "speculators-zoo-eagle3": ("eagle3", "eagle3")}


def write_pair(root: Path, name: str) -> tuple[str, str, str]:
    """(method, target dir, drafter dir) of one corpus pair, written under ``root`` (config.json only; the zoo's
    pairs are its own directories, weights included)."""
    if name in ZOO_PAIRS:
        method, drafter = ZOO_PAIRS[name]
        return method, str(ZOO / "target"), str(ZOO / drafter)
    method, target, drafter, _ = PAIRS[name]
    paths = []
    for role, config in (("target", target), ("draft", drafter)):
        path = root / name / role
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=1))
        paths.append(str(path))
    return method, paths[0], paths[1]


NAMES = [*PAIRS, *ZOO_PAIRS]
