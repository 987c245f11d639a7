"""Shared fixtures, and the test tiers.

Every test module lives in its tier's folder (tests/unit, tests/model, tests/server, tests/slow)
and declares that tier with ``pytestmark``:
- ``unit``: pure code, no model (seconds);
- ``model``: the real packaged model in this process, loaded once per session (``runtime``);
- ``server``: real processes on loopback (``start_server``, the CLI, stand-in SGLang servers);
- ``slow``: long hostile-input and load runs (longer still under ``make fuzz`` / ``make load-test``).
``make test PYTEST_ARGS=tests/unit`` runs one tier; ``make test`` runs them all.
"""

from __future__ import annotations

import os
import shutil

import pytest

from support.server_process import ServerProcess

TIERS = ("unit", "model", "server", "slow")


def pytest_collection_modifyitems(items):
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid}: a test module declares exactly one tier of {TIERS} "
                                    f"(pytestmark), found {tiers}")
        folder = item.path.parent.name
        if folder != tiers[0]:
            raise pytest.UsageError(f"{item.nodeid}: a {tiers[0]} test belongs in tests/{tiers[0]}/, not tests/{folder}/")


@pytest.fixture(scope="session")
def runtime():
    from asr_service.runtime import RuntimeSettings, build_runtime

    # The CPU engine, also where a GPU is present: it is the reference the CUDA tests compare with.
    rt = build_runtime(RuntimeSettings(device="cpu", threads=int(os.environ.get("ASR_TEST_THREADS", "0")) or None))
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def adapter(runtime):
    return runtime.adapter


@pytest.fixture(scope="session")
def tok(adapter):
    return adapter.tok


@pytest.fixture(scope="session")
def sglang_judges(runtime):
    """SGLang's own request code per release (support/sglang_judge.py), started together."""
    from support.sglang_judge import SGLANG_VERSIONS, SGLangJudge

    judges = {version: SGLangJudge(version, runtime.loaded.tokenizer_file) for version in SGLANG_VERSIONS}
    yield judges
    for judge in judges.values():
        judge.close()


@pytest.fixture(scope="session")
def four_voices():
    """support/speakers.py's short four-voice conversation (audio, truth), synthesized once."""
    missing = [tool for tool in ("text2wave", "espeak-ng") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"speech synthesizers missing ({', '.join(missing)}); `make test` installs them as root")
    from support.speakers import build
    return build(short=True)


@pytest.fixture(scope="module")
def start_server():
    """Start ``asr-service serve`` processes (flags as arguments); each is ready when returned
    (``ready=False``: just started; ``open_files``, ``address_space``: its limits) and stopped when
    the module's tests are done."""
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True,
              open_files: int | None = None, address_space: int | None = None) -> ServerProcess:
        proc = ServerProcess(*args, env=env, open_files=open_files, address_space=address_space)
        started.append(proc)
        if ready:
            proc.wait_ready()
        return proc

    yield start
    for proc in started:
        proc.stop()
    # A task that died with an exception nobody awaited is a request left hanging somewhere.
    lost = [proc.log_path for proc in started if "Task exception was never retrieved" in proc.log_path.read_text()]
    assert not lost, f"a server's log has a task that died unobserved: {lost}"
