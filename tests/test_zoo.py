"""The trained zoo as committed: the files its manifest names, the corpus it was trained on, the two
declarations of its DFlash drafter. No torch: the weights are hashed, not loaded.

Whether ``make zoo`` still reproduces the weights is not checked here (it trains for ~25 minutes
in its own venv). ``.venv-zoo/bin/python -m tools.zoo --check`` (``make zoo-check``, about a
minute) rebuilds the tokenizer and reruns the target's first steps against the manifest; this
module checks what that rests on: the corpus generator still makes what the weights saw.
"""

from __future__ import annotations

import hashlib
import json

from spectrace.testing import trained
from spectrace.testing.zoo_corpus import documents, prompts


def test_manifest_names_every_committed_file_with_its_sha256():
    recorded = trained.manifest()["files"]
    on_disk = {
        str(p.relative_to(trained.ZOO)): p
        for p in trained.ZOO.rglob("*")
        if p.is_file() and p.name != "manifest.json" and "__pycache__" not in p.parts
    }
    assert sorted(on_disk) == sorted(recorded)
    for name, path in on_disk.items():
        assert trained.sha256(path) == recorded[name]["sha256"], name
        assert path.stat().st_size == recorded[name]["bytes"], name
    assert {"target/model.safetensors", "dflash/model.safetensors", "eagle3/model.safetensors"} <= set(recorded)
    assert sum(f["bytes"] for f in recorded.values()) < 8 << 20  # a few MB in the repository


def test_corpus_is_deterministic_and_is_the_one_the_zoo_was_trained_on():
    assert documents(0, 50) == documents(0, 50)
    assert documents(0, 50) != documents(1, 50)
    assert prompts(7, 4, 300) == prompts(7, 4, 300) and all(len(p) >= 300 for p in prompts(7, 4, 300))
    manifest = trained.manifest()
    for name, digest in manifest["corpus_sha256"].items():
        seed = manifest["seeds"][name]
        assert hashlib.sha256("\x00".join(documents(seed, 500)).encode()).hexdigest() == digest, name


def test_dflash_declarations_differ_in_their_window_fields_alone(tmp_path):
    shipped = json.loads((trained.dflash_declared(tmp_path / "a", "as-shipped") / "config.json").read_text())
    fixed = json.loads((trained.dflash_declared(tmp_path / "b", "fixed") / "config.json").read_text())
    window = trained.window()
    assert trained.manifest()["settings"]["dflash_window"] == window
    assert shipped["sliding_window"] == fixed["sliding_window"] == window
    assert "use_sliding_window" not in shipped and "layer_types" not in shipped
    assert fixed["use_sliding_window"] is True and fixed["layer_types"] == ["sliding_attention"]
    rest = {k: v for k, v in fixed.items() if k not in ("use_sliding_window", "layer_types")}
    assert rest == shipped
    assert shipped["dflash_config"]["causal"] is True  # as speculators trained it, in both
    taps = trained.manifest()["settings"]["taps"]
    assert shipped["dflash_config"]["target_layer_ids"] == [t - 1 for t in taps]  # vLLM's DFlash indexing
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (trained.ZOO / "dflash" / "model.safetensors").read_bytes()
