"""Warmup compiles each grammar variant once and drains a decode through each."""

import pytest
from asr_service.warmup import run_warmup, variant_params

pytestmark = pytest.mark.model


async def test_warmup_compiles_every_variant_once(runtime):
    adapter = runtime.adapter
    report = await run_warmup(adapter, runtime.engine)
    assert len(report.variants) == 8 and all(s > 0 for s in report.step_seconds.values())
    assert "audio-sized encoder" in report.step_seconds  # realtime previews' encoder is warm too
    keys = {adapter.grammars.key(t, ts, langs) for t in ("transcribe", "translate") for ts in (False, True)
            for langs in (None, adapter.supported_languages)}
    assert len(keys) == 8
    for key in keys:
        assert adapter.grammars.compile_counts[key] == 1, key
    # Building the variants again (as requests do) compiles nothing new.
    before = dict(adapter.grammars.compile_counts)
    list(variant_params(adapter))
    assert dict(adapter.grammars.compile_counts) == before
