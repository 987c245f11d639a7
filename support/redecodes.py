"""A server's redecode counts, read from its /metrics (prometheus-client's own text parser)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def redecodes(url: str, headers: dict | None = None) -> dict[str, float]:
    """{rule: times} of the server's asr_redecodes counter so far."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=30).text
    return {sample.labels["rule"]: sample.value
            for family in text_string_to_metric_families(text) if family.name == "asr_redecodes"
            for sample in family.samples if sample.name == "asr_redecodes_total"}


def redecodes_since(url: str, before: dict[str, float], headers: dict | None = None) -> dict[str, int]:
    """{rule: times} counted since ``before`` (a redecodes() reading); rules not counted left out."""
    now = redecodes(url, headers)
    return {rule: int(times - before.get(rule, 0)) for rule, times in now.items() if times > before.get(rule, 0)}
