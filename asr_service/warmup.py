"""Start-up warmup: compile every grammar variant once and run a warm decode through each.

Variants: transcribe/translate x notimestamps/timestamps, each both for fused detection over
the full language set and for a known language (text-only grammar). Grammar cache keys are
deterministic, so each variant compiles exactly once; a short decode on silence through each
variant, drained to the end, pays the first-call costs (allocation, kernels, matcher setup)
before the server says it is ready; so does one decode through the audio-sized encoder that
realtime previews use, where the engine has it. Where one copy reaches everything that decodes
(the embedded engine, or a single SGLang server), every warm decode goes at once, as one batch.
With several SGLang servers behind the service, each variant is sent once per server at the
same time (least-outstanding balancing gives each server one), so every server compiles every
grammar before real traffic; a server that is down is skipped (the warm decode
ends "unavailable") and /health reports it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace

import numpy as np

from adapters.base import TranscriptionAdapter
from asr_service.engine.interface import Engine

log = logging.getLogger(__name__)

WARM_AUDIO_SECONDS = 0.5


@dataclass
class WarmupReport:
    variants: list[str] = field(default_factory=list)
    step_seconds: dict[str, float] = field(default_factory=dict)
    total_seconds: float = 0.0


def variant_params(adapter):
    """(name, DecodeParams) for every variant the server can use without a candidate list."""
    known = adapter.supported_languages[0]
    for task in adapter.supported_tasks:
        for timestamps in (False, True):
            mode = "timestamps" if timestamps else "notimestamps"
            if adapter.supports_language_detection:
                yield f"{task}/{mode}/detect", adapter.build_fused_autodetect_params(task, timestamps)
            yield f"{task}/{mode}/known-language", adapter.build_prompt(known, task, timestamps)


async def _warm_decode(engine: Engine, silence: np.ndarray, params, since: float) -> float:
    """Seconds from ``since`` until every copy of the decode is drained to its end."""
    streams = [engine.submit(silence, params) for _ in range(engine.warm_copies)]
    await asyncio.gather(*(stream.collect() for stream in streams))
    return round(time.perf_counter() - since, 3)


async def run_warmup(adapter: TranscriptionAdapter, engine: Engine) -> WarmupReport:
    report = WarmupReport()
    start = time.perf_counter()
    silence = np.zeros(int(WARM_AUDIO_SECONDS * adapter.config.sample_rate), dtype=np.float32)
    variants = list(variant_params(adapter))  # building the params compiles the grammars
    warmed = variants.copy()
    if engine.audio_sized_encoder:  # realtime previews' encoder (the silent window it splices in)
        params = replace(adapter.build_prompt(adapter.supported_languages[0]), audio_sized_encoder=True)
        warmed.append(("audio-sized encoder", params))
    # One copy a variant (the embedded engine, or one server): every warm decode at once, stepped
    # as one batch. Several servers take one variant at a time, its copies together:
    # least-outstanding balancing then gives each server one copy of each, where variants sent
    # together would leave that to its tie-breaking.
    rounds = [warmed] if engine.warm_copies == 1 else [[variant] for variant in warmed]
    for round_ in rounds:
        since = time.perf_counter()
        seconds = await asyncio.gather(*(_warm_decode(engine, silence, params, since) for _, params in round_))
        for (name, _), taken in zip(round_, seconds):
            report.step_seconds[name] = taken
            log.info("warmup %s: warm decode in %.2fs", name, taken)
    report.variants = [name for name, _ in variants]
    report.total_seconds = round(time.perf_counter() - start, 3)
    log.info("warmup done: %d variants in %.2fs", len(report.variants), report.total_seconds)
    return report
