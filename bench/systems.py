"""The systems under test, each in its own process: this service over HTTP, peers in workers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

from support.server_process import ServerProcess
from .workloads import Outcome, Request


class RssSampler:
    """Peak resident memory of a process and its children, sampled every 50 ms."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                rss = self.proc.memory_info().rss + sum(c.memory_info().rss for c in self.proc.children(recursive=True))
                self.peak = max(self.peak, rss)
            except psutil.Error:
                pass
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class Service:
    """This service over HTTP: a real server process, requests with or without a language."""

    def __init__(self, name: str, *server_args: str, fixed_language: bool = False):
        self.name, self.fixed_language = name, fixed_language
        self.server = ServerProcess("--threads", str(os.cpu_count()), *server_args)
        self.server.wait_ready()
        self.pid = self.server.proc.pid
        self.precision = httpx.get(self.server.url + "/health").json()["precision"]  # what --quantize resolved to

    async def _one(self, client: httpx.AsyncClient, r: Request) -> Outcome:
        data = {"response_format": "verbose_json"}
        if self.fixed_language:
            data["language"] = r.language
        start = time.perf_counter()
        resp = await client.post(self.server.url + "/v1/audio/transcriptions", data=data,
                                 files={"file": ("a.wav", r.wav, "audio/wav")}, timeout=600)
        resp.raise_for_status()
        body = resp.json()
        return Outcome(body["text"], body["language"], time.perf_counter() - start)

    def run(self, reqs: list[Request], concurrency: int) -> tuple[list[Outcome], float]:
        async def go():
            sem = asyncio.Semaphore(concurrency)
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency + 2)) as client:
                async def limited(r):
                    async with sem:
                        return await self._one(client, r)

                start = time.perf_counter()
                outcomes = await asyncio.gather(*(limited(r) for r in reqs))
                return outcomes, time.perf_counter() - start

        return asyncio.run(go())

    def stream_first_delta(self, r: Request) -> tuple[float, float]:
        """(seconds to the first delta, seconds to the whole streamed response)."""
        start = time.perf_counter()
        first = None
        with httpx.stream("POST", self.server.url + "/v1/audio/transcriptions", data={"stream": "true"},
                          files={"file": ("a.wav", r.wav, "audio/wav")}, timeout=600) as resp:
            for line in resp.iter_lines():
                if first is None and "transcript.text.delta" in line:
                    first = time.perf_counter() - start
        return first or float("nan"), time.perf_counter() - start

    def stop(self):
        self.server.stop()


class Peer:
    """faster-whisper or HF in a worker process (bench/peer_worker.py)."""

    def __init__(self, name: str, *worker_args: str, fixed_language: bool = False):
        self.name, self.fixed_language = name, fixed_language
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.peer_worker", *worker_args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     cwd=Path(__file__).resolve().parent.parent)
        assert json.loads(self.proc.stdout.readline())["ready"]
        self.pid = self.proc.pid

    def run(self, reqs: list[Request], concurrency: int) -> tuple[list[Outcome], float]:
        job = {"files": [r.path for r in reqs], "concurrency": concurrency,
               "languages": [r.language if self.fixed_language else None for r in reqs]}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        outcomes = [Outcome(o["text"], o["language"], o["latency_s"]) for o in answer["results"]]
        return outcomes, answer["wall_s"]

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# faster-whisper in the configurations that suit this machine: one model on all cores (requests
# queue), or one single-threaded worker per core; int8 or float32.
def _layouts() -> dict[str, list[str]]:
    cores = str(os.cpu_count())
    return {"sequential": ["--threads", cores, "--num-workers", "1"], "workers": ["--threads", "1", "--num-workers", cores]}


FASTER_WHISPER = {f"faster-whisper-{short}-{layout}": (precision, layout)
                  for short, precision in (("int8", "int8"), ("f32", "float32")) for layout in ("sequential", "workers")}


def faster_whisper(name: str) -> Peer:
    """One of FASTER_WHISPER's configurations, by its bench name."""
    precision, layout = FASTER_WHISPER[name]
    return Peer(name, "faster-whisper", "--compute-type", precision, *_layouts()[layout])
