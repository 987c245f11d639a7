"""The /generate bodies the front builds, judged by SGLang's own request code (not a reading of
it): every release in SGLANG_VERSIONS, installed by `make test` into side folders
(support/sglang_env.py) and run on this interpreter (support/sglang_contract.py).

Before the fix in wire.generate_body, every body was refused by GenerateReqInput on both
releases ("Either text, input_ids or input_embeds should be provided."). SGLang 0.5.22 and later
also refuse the private ``_detect_language`` key at their JSON contract gate: until the front
sends its prompt another way (issue 17's processor plugin), that check is an expected failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from asr_service.engine.sglang.wire import generate_body

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
SGLANG_VERSIONS = ("0.5.21", "0.5.23")  # the Makefile builds the same list


def bodies(adapter) -> dict[str, dict]:
    """One body of every kind the front sends."""
    audio = np.zeros(16000, np.float32)
    fused = adapter.build_fused_autodetect_params()
    sampled = replace(adapter.build_prompt("en"), temperature=0.4, top_k=5, top_p=0.9, seed=7)
    kinds = {"fused detection": fused, "known language": adapter.build_prompt("fr"),
             "translate": adapter.build_prompt("de", "translate"),
             "timestamps": adapter.build_prompt("en", "transcribe", True), "sampling": sampled}
    return {name: generate_body(f"rid-{i}", audio, params) for i, (name, params) in enumerate(kinds.items())}


def judged(version: str, sent: dict[str, dict]) -> dict[str, dict]:
    side = ROOT / ".sglang" / version
    assert (side / ".complete").exists(), f"{side} is missing: `make test` builds it (make sglang-envs)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(side), str(ROOT)])}
    out = subprocess.run([sys.executable, "-m", "support.sglang_contract"], input="".join(
        json.dumps(b) + "\n" for b in sent.values()), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(zip(sent, map(json.loads, out.stdout.splitlines())))


@pytest.fixture(scope="module")
def verdicts(adapter) -> dict[str, dict[str, dict]]:
    sent = bodies(adapter)
    return {version: judged(version, sent) for version in SGLANG_VERSIONS}


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_every_body_passes_sglangs_request_class(verdicts, version):
    refused = {kind: v["request_error"] for kind, v in verdicts[version].items() if v["request_error"]}
    assert not refused, refused


class RefusedForThePrivateKey(Exception):
    pass


@pytest.mark.xfail(strict=True, raises=RefusedForThePrivateKey,
                   reason="0.5.22+ refuse the private _detect_language key at their contract gate; the processor "
                          "plugin of issue 17 is not built yet")
def test_every_body_passes_the_contract_gate_of_current_sglang(verdicts):
    current = verdicts[SGLANG_VERSIONS[-1]]
    assert all(v["has_contract_gate"] for v in current.values())
    refused = {kind: v["contract_error"] for kind, v in current.items() if v["contract_error"]}
    if refused and all("unknown field `_detect_language`" in error for error in refused.values()):
        raise RefusedForThePrivateKey(refused)  # the known gap, and nothing else
    assert not refused, refused
