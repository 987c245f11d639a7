"""A STAND-IN for the Hugging Face hub, on loopback: these machines cannot reach the real one.

It answers the few routes ``huggingface_hub.snapshot_download`` calls (repository info at a
revision, the recursive file tree, HEAD and GET of a file by revision) for repositories built
in the tests from the packaged model's files, and fails the way the hub fails: 404 with the
hub's ``X-Error-Code`` for an unknown repository or revision. What it serves is judged by
huggingface_hub itself (the client the server uses): headers or listings it would not accept
fail the tests. A file can be marked broken (its download stops halfway, as a dropped
connection does) or slow.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from support.server_process import free_port

CHUNK = 1 << 20


@dataclass
class StandinRepo:
    files: dict[str, Path]  # name in the repository -> file on disk

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + str(self.files[name].stat().st_size).encode())
        return digest.hexdigest()


@dataclass
class StandinHub:
    repos: dict[str, StandinRepo] = field(default_factory=dict)
    broken: set[tuple[str, str]] = field(default_factory=set)  # (repo, file) whose GET stops halfway
    slow: dict[tuple[str, str], float] = field(default_factory=dict)  # (repo, file) -> seconds per 1 MB sent
    requests: list[str] = field(default_factory=list)  # "METHOD path" of every request seen
    url: str = ""

    def add(self, repo: str, directory: Path, extra: dict[str, bytes] | None = None) -> None:
        """A repository holding every file of ``directory`` (and ``extra`` small files)."""
        files = {p.name: p for p in sorted(directory.iterdir()) if p.is_file()}
        for name, content in (extra or {}).items():
            path = directory.parent / f"{directory.name}-extra-{name}"
            path.write_bytes(content)
            files[name] = path
        self.repos[repo] = StandinRepo(files)

    # ---- routes ----
    def _repo(self, request: Request) -> tuple[str, StandinRepo | None, str | None]:
        repo_id = f"{request.path_params['owner']}/{request.path_params['name']}"
        repo = self.repos.get(repo_id)
        revision = request.path_params.get("revision", "main")
        commit = None if repo is None else {"main": repo.commit, repo.commit: repo.commit}.get(revision)
        return repo_id, repo, commit

    @staticmethod
    def _missing(repo: StandinRepo | None, repo_id: str, revision: str) -> Response:
        if repo is None:
            return JSONResponse({"error": f"Repository not found: {repo_id}"}, 404, headers={"X-Error-Code": "RepoNotFound"})
        return JSONResponse({"error": f"Invalid rev id: {revision}"}, 404, headers={"X-Error-Code": "RevisionNotFound"})

    async def info(self, request: Request) -> Response:
        self.requests.append(f"{request.method} {request.url.path}")
        repo_id, repo, commit = self._repo(request)
        if commit is None:
            return self._missing(repo, repo_id, request.path_params.get("revision", "main"))
        return JSONResponse({"id": repo_id, "modelId": repo_id, "sha": commit, "private": False, "gated": False,
                             "disabled": False, "tags": [], "siblings": [{"rfilename": n} for n in sorted(repo.files)]})

    async def tree(self, request: Request) -> Response:
        self.requests.append(f"{request.method} {request.url.path}")
        repo_id, repo, commit = self._repo(request)
        if commit is None:
            return self._missing(repo, repo_id, request.path_params["revision"])
        return JSONResponse([{"type": "file", "path": name, "size": path.stat().st_size,
                              "oid": hashlib.sha1(name.encode() + commit.encode()).hexdigest()}
                             for name, path in sorted(repo.files.items())])

    async def resolve(self, request: Request) -> Response:
        self.requests.append(f"{request.method} {request.url.path}")
        repo_id, repo, commit = self._repo(request)
        if commit is None:
            return self._missing(repo, repo_id, request.path_params["revision"])
        name = request.path_params["path"]
        if name not in repo.files:
            return JSONResponse({"error": "Entry not found"}, 404, headers={"X-Error-Code": "EntryNotFound"})
        path = repo.files[name]
        size = path.stat().st_size
        headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(f"{commit}/{name}".encode()).hexdigest()}"',
                   "Content-Length": str(size), "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            return Response(headers=headers)
        start = 0
        if (spec := request.headers.get("range", "")).startswith("bytes="):
            start = int(spec[len("bytes="):].split("-")[0] or 0)
        broken = (repo_id, name) in self.broken
        pause = self.slow.get((repo_id, name), 0.0)

        def body():
            with open(path, "rb") as f:
                f.seek(start)
                sent = start
                while chunk := f.read(CHUNK):
                    if broken and sent + len(chunk) > size // 2:
                        raise ConnectionError("stand-in hub: the connection dropped halfway")
                    sent += len(chunk)
                    time.sleep(pause)  # this generator runs on a worker thread of the stand-in
                    yield chunk

        headers["Content-Length"] = str(size - start)
        if start:
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        return StreamingResponse(body(), status_code=206 if start else 200, headers=headers,
                                 media_type="application/octet-stream")

    def app(self) -> Starlette:
        repo = "/{owner}/{name}"
        return Starlette(routes=[
            Route(f"/api/models{repo}", self.info),
            Route(f"/api/models{repo}/revision/{{revision}}", self.info),
            Route(f"/api/models{repo}/tree/{{revision}}", self.tree),
            Route(f"{repo}/resolve/{{revision}}/{{path:path}}", self.resolve, methods=["GET", "HEAD"]),
        ])

    def start(self) -> "StandinHub":
        port = free_port()
        # Quiet: a broken download is an error uvicorn would log with its traceback.
        self._server = uvicorn.Server(uvicorn.Config(self.app(), host="127.0.0.1", port=port, log_level="critical"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        while not self._server.started:
            threading.Event().wait(0.05)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
