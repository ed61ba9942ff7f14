"""Helpers of the observability tests: waiting for a consumer to acknowledge, scraping /metrics.
Every wait has a deadline."""

from __future__ import annotations

import urllib.request

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client.parser import text_string_to_metric_families

DEADLINE = 20.0


async def acknowledged(js: JetStreamContext, stream: str, durable: str, seq: int) -> bool:
    """Whether the consumer has been delivered stream sequence `seq` and acknowledged all."""
    try:
        info = await js.consumer_info(stream, durable)
    except NotFoundError:
        return False
    delivered = info.delivered.stream_seq if info.delivered else 0
    return (delivered or 0) >= seq and info.num_ack_pending == 0 and info.num_pending == 0


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics on 127.0.0.1:`port`: sample (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples
