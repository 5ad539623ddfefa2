"""`make gpu-check` on a machine without a GPU fails at once, loudly (it is never a silent skip).
On this CPU machine the same checks run for real with --cpu (V1 runner, sync scheduling):
``python -m spectrace.testing.gpu_check --cpu``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.vllm  # imports torch


def test_gpu_check_fails_loudly_without_a_gpu():
    assert not torch.cuda.is_available()  # this suite runs on CPU machines
    proc = subprocess.run([sys.executable, "-m", "spectrace.testing.gpu_check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "gpu-check needs a CUDA GPU" in proc.stderr and proc.stderr.startswith("FAIL")
