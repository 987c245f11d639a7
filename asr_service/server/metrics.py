"""Prometheus metrics (prometheus-client), one registry per app.

Counted as things happen: requests by endpoint and status, their latency, audio seconds
transcribed, detection outcomes by language, window redecodes by the rule that asked for them,
requests refused by backpressure. Read from the
engine and the server when /metrics is scraped: queue depth, active sequences, batch size per
decode step, tokens decoded (rate() of it is tokens per second), the engine's time by phase,
pending work, realtime sessions, warmup time.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ..engine.interface import ENGINE_PHASES

# Route templates that get their own label; anything else (404s, probes) counts as "other".
ENDPOINTS = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations", "/v1/models", "/v1/realtime",
                       "/health", "/metrics", "/"})
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


def endpoint_label(path: str) -> str:
    if path in ENDPOINTS:
        return path
    return "/page" if path.startswith("/page/") else "other"


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("asr_requests", "HTTP requests and WebSocket sessions, by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("asr_request_duration_seconds", "Time from request start to the last byte sent",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.audio_seconds = Counter("asr_audio_seconds", "Seconds of audio transcribed", ["endpoint"],
                                     registry=self.registry)
        self.detections = Counter("asr_language_detections",
                                  "Requests without a language: the detected language, or outcome=failed",
                                  ["language", "outcome"], registry=self.registry)
        self.redecodes = Counter("asr_redecodes", "Parts of windows decoded again, by the rule that asked for it "
                                 "(unparsed, compression_ratio, avg_logprob: the temperature fallback; "
                                 "repeats_across_pauses, segment_across_pause: cut at pauses; open_timestamp, "
                                 "speech_after_text: continued; language_outlier)", ["rule"], registry=self.registry)
        self.rejected = Counter("asr_rejected_requests", "Requests refused before any work (backpressure, draining)",
                                ["reason"], registry=self.registry)

    def watch(self, read_state: Callable[[], dict | None]) -> None:
        """Gauges read at scrape time: ``read_state`` returns the figures, or None before start-up."""
        self.registry.register(_StateCollector(read_state))

    def detection(self, language: str | None) -> None:
        self.detections.labels(language or "none", "detected" if language else "failed").inc()

    def redecoded(self, redecodes: dict[str, int]) -> None:
        for rule, times in redecodes.items():
            self.redecodes.labels(rule).inc(times)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector:
    def __init__(self, read_state: Callable[[], dict | None]):
        self._read = read_state

    def collect(self):
        state = self._read()
        if state is None:
            return
        for name, help_text in (("queued_sequences", "Sequences waiting for an engine slot"),
                                ("active_sequences", "Sequences being decoded"),
                                ("pending_requests", "Requests admitted and not finished"),
                                ("pending_audio_seconds", "Audio seconds admitted and not finished"),
                                ("realtime_sessions", "Open /v1/realtime sessions"),
                                ("warmup_seconds", "Time the start-up warmup took")):
            yield GaugeMetricFamily(f"asr_{name}", help_text, value=state[name])
        yield CounterMetricFamily("asr_decoded_tokens", "Tokens decoded (rate() gives tokens per second)",
                                  value=state["tokens"])
        yield from _backend_families(state["backends"] or [])
        if state["steps"] is not None:  # the embedded engine's own loop (SGLang batches inside its servers)
            yield CounterMetricFamily("asr_decode_steps", "Engine decode steps", value=state["steps"])
            yield _batch_size_histogram(state["batch_sizes"])
            phases = CounterMetricFamily("asr_engine_phase_seconds", "Engine thread time by phase: "
                                         + ", ".join(ENGINE_PHASES), labels=["phase"])
            for phase, seconds in state["phase_seconds"].items():
                phases.add_metric([phase], seconds)
            yield phases


def _batch_size_histogram(sizes: dict[int, int]) -> HistogramMetricFamily:
    """{batch size: steps} as a histogram of sequences decoded together per step."""
    buckets = [(str(bound), sum(count for size, count in sizes.items() if size <= bound))
               for bound in (1, 2, 4, 8, 16, 32, 64)]
    buckets.append(("+Inf", sum(sizes.values())))
    return HistogramMetricFamily("asr_batch_size", "Sequences decoded together, per decode step", buckets=buckets,
                                 sum_value=sum(size * count for size, count in sizes.items()))


LAST_ERROR_LABEL_LENGTH = 300  # /health has the whole reason


def _backend_families(backends: list[dict]):
    """Each SGLang backend's state (none with the embedded engine), labelled by its URL."""
    if not backends:
        return
    families = {
        "up": GaugeMetricFamily("asr_backend_up", "1 when the SGLang backend takes work, 0 while it is out", labels=["url"]),
        "info": GaugeMetricFamily("asr_backend_info", "The SGLang backend's state (up, down, unchecked: not yet "
                                  "through its canary) and how it is sent prompts (input_ids: the plugin; "
                                  "detect_key: SGLang's private key; none until admitted), and why it last "
                                  "failed (empty if it never did)",
                                  labels=["url", "state", "prompt_carrier", "last_error"]),
        "outstanding": GaugeMetricFamily("asr_backend_outstanding", "Decodes sent to the backend and not finished",
                                         labels=["url"]),
        "completed": CounterMetricFamily("asr_backend_completed", "Decodes the backend finished", labels=["url"]),
        "failures": CounterMetricFamily("asr_backend_failures", "Times the backend failed and was taken out",
                                        labels=["url"]),
    }
    for b in backends:
        families["up"].add_metric([b["url"]], 1 if b["state"] == "up" else 0)
        families["info"].add_metric([b["url"], b["state"], b["prompt_carrier"] or "none",
                                     (b["last_error"] or "")[:LAST_ERROR_LABEL_LENGTH]], 1)
        for name in ("outstanding", "completed", "failures"):
            families[name].add_metric([b["url"]], b[name])
    yield from families.values()
