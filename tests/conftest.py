"""Shared fixtures: the real packaged model is loaded once per test session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def runtime():
    from asr_service.runtime import build_runtime

    rt = build_runtime(threads=int(os.environ.get("ASR_TEST_THREADS", "0")) or None)
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def adapter(runtime):
    return runtime.adapter


@pytest.fixture(scope="session")
def tok(adapter):
    return adapter.tok
