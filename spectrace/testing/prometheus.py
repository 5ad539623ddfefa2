"""A real Prometheus (Debian's ``prometheus`` binary) on 127.0.0.1, for tests and benchmarks."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


class PrometheusUnavailable(RuntimeError):
    pass


def free_port() -> int:
    """A port with a few free neighbours (spectrace endpoints take base, base+1, ...)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 60000 and all(_free(port + i) for i in range(1, 8)):
            return port
    raise RuntimeError("no free port range on 127.0.0.1")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PrometheusServer:
    """``prometheus`` scraping ``targets`` every second; rule files optional."""

    def __init__(self, workdir: Path, *, targets: list[str], rule_files: list[Path] | None = None, interval: str = "1s") -> None:
        self.workdir = Path(workdir)
        self.targets = targets
        self.rule_files = rule_files or []
        self.interval = interval
        self.port = 0
        self._proc: subprocess.Popen | None = None

    def start(self) -> "PrometheusServer":
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusUnavailable("the prometheus binary is missing: apt-get install prometheus (make test does)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        rules = "".join(f"\n  - {path}" for path in self.rule_files)
        config = self.workdir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {self.interval}\n  evaluation_interval: {self.interval}\n"
            + (f"rule_files:{rules}\n" if rules else "")
            + "scrape_configs:\n  - job_name: spectrace\n    static_configs:\n"
            + f"      - targets: {json.dumps(self.targets)}\n"
        )
        self._log = open(self.workdir / "prometheus.log", "w")
        self._proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
                return self
            except OSError:
                if self._proc.poll() is not None:
                    raise PrometheusUnavailable((self.workdir / "prometheus.log").read_text()[-2000:])
                time.sleep(0.1)
        raise PrometheusUnavailable("prometheus did not become ready in 30 s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._log.close()

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def api(self, path: str, **params: Any) -> Any:
        """One API call's ``data``. A read that times out is asked again (three tries of 20 s): on a 2-core box
        beside a vLLM server under load, Prometheus once left a ``rules`` call unanswered for 10 s."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        for attempt in range(3):
            try:
                with urllib.request.urlopen(url, timeout=20) as response:
                    body = json.loads(response.read())
                break
            except TimeoutError:
                if attempt == 2:
                    raise
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {body}")
        return body["data"]

    def query(self, promql: str, *, wait_s: float = 15.0) -> list[dict[str, Any]]:
        """Instant query; waits up to ``wait_s`` for a non-empty result (scrapes land every interval)."""
        deadline = time.time() + wait_s
        while True:
            result = self.api("query", query=promql)["result"]
            if result or time.time() > deadline:
                return result
            time.sleep(0.5)
