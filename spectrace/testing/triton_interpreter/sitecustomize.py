"""Test harness, not a deployment: Model Runner V2 on a CPU through Triton's interpreter.

vLLM's V2 model runner needs Triton kernels, and ``vllm/triton_utils/importing.py`` on the CPU build accepts
Triton only when ``triton.backends.backends`` has a ``"cpu"`` entry (triton-cpu, on no package index). The PyPI
``triton`` in the venv has no such backend, but its interpreter (``TRITON_INTERPRET=1``) runs every ``@triton.jit``
kernel in Python on torch CPU tensors. This module, put first on ``PYTHONPATH`` by
:func:`spectrace.testing.engine.base_env` (``runner="v2"``), is imported by every Python process that starts
with that path -- the test's engine child, vLLM's engine core and its workers -- and, only where
``TRITON_INTERPRETER_HARNESS=1``, sets ``TRITON_INTERPRET=1`` and registers a backend whose driver says
it is active, before vLLM is imported: as ``"cpu"`` (what the CPU build's check asks for) and as ``"interpreter"``
(the one active driver the check of a build without "cpu" in its version asks for: the CUDA wheel of vLLM 0.34,
read on this machine by ``bench/check_vllm_static.py``'s doctor run with ``VLLM_TARGET_DEVICE=cpu``). Kernels run about 3x slower than the V1 runner's torch code;
the CPU platform still turns async scheduling off. Nothing of spectrace's product imports it.
"""

import os
import sys

if os.environ.get("TRITON_INTERPRETER_HARNESS") == "1":
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        from triton.backends import Backend, backends
        from triton.backends.compiler import BaseBackend
        from triton.backends.driver import DriverBase

        class _InterpreterDriver(DriverBase):
            """Stands for triton-cpu's driver in vLLM's check; the interpreter runs the kernels."""

            @classmethod
            def is_active(cls) -> bool:
                return True

        for name in ("cpu", "interpreter"):
            backends.setdefault(name, Backend(compiler=BaseBackend, driver=_InterpreterDriver))
    except Exception as exc:  # the harness cannot stand: say so, and let vLLM refuse V2 with its own words
        print(f"spectrace.testing triton_interpreter: no 'cpu' Triton backend registered: {exc!r}", file=sys.stderr)
