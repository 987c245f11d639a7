"""A real `asr-service serve` process on loopback, for API tests and bench runs."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *extra_args: str, env: dict[str, str] | None = None, open_files: int | None = None,
                 address_space: int | None = None):
        """``open_files``: the process's limit on open files (soft and hard), when not inherited;
        ``address_space``: its limit on memory in bytes (a test that could make a faulty server
        read without end gets a MemoryError there instead of the machine's OOM killer)."""
        rlimits = {resource.RLIMIT_NOFILE: open_files, resource.RLIMIT_AS: address_space}
        rlimits = {name: value for name, value in rlimits.items() if value is not None}

        def set_limits():
            for name, value in rlimits.items():
                resource.setrlimit(name, (value, value))

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(f"/tmp/asr-service-test-{self.port}.log")
        self._log = open(self.log_path, "w")
        script = Path(sys.executable).parent / "asr-service"
        self.proc = subprocess.Popen([str(script), "serve", "--port", str(self.port), *extra_args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                     preexec_fn=set_limits if rlimits else None)
        self.health_statuses: list[int] = []

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            try:
                status = httpx.get(self.url + "/health", timeout=2).status_code
                self.health_statuses.append(status)
                if status == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready in {timeout}s: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()
