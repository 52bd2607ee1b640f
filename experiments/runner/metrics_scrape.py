"""Tokens-per-forward-step histograms from a vLLM server's Prometheus /metrics.

vLLM (v1 engine, ``vllm/v1/metrics/loggers.py``) observes, for every engine step, the prompt
tokens computed plus the tokens generated into the histogram ``vllm:iteration_tokens_total``.
Scraping it before and after a replay and subtracting gives the step-size distribution that the
server actually ran for that replay: the shape mix the attribution weights kernel times by.

A histogram is stored as ``{"buckets": [upper bounds, the last one "+Inf"], "counts": [steps per
bucket, not cumulative], "count": steps, "sum": tokens}`` (JSON has no infinity; float("+Inf") reads it).
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

METRIC = "vllm:iteration_tokens_total"


@dataclass(frozen=True)
class CumulativeHistogram:
    """One scrape of a Prometheus histogram, summed over its label sets (engines)."""

    bounds: tuple[float, ...]  # upper bounds, ascending, the last one +inf
    cumulative: tuple[float, ...]  # steps <= bound
    count: float
    total: float  # the _sum sample: tokens over all steps


def fetch_metrics_text(url: str, timeout_s: float = 10.0) -> str:
    """GET <url>/metrics as text (raises OSError / urllib errors on failure)."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout_s) as resp:
        return resp.read().decode("utf-8", errors="replace")


def parse_histogram(text: str, metric: str = METRIC) -> CumulativeHistogram:
    """The histogram `metric` in Prometheus exposition `text`; ValueError if it is absent."""
    by_le: dict[float, float] = {}
    count = total = 0.0
    found = False
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        found = True
        for s in family.samples:
            if s.name == f"{metric}_bucket":
                le = float(s.labels["le"])
                by_le[le] = by_le.get(le, 0.0) + s.value
            elif s.name == f"{metric}_count":
                count += s.value
            elif s.name == f"{metric}_sum":
                total += s.value
    if not found or not by_le:
        raise ValueError(f"metric {metric} not found in the /metrics text")
    bounds = tuple(sorted(by_le))
    return CumulativeHistogram(bounds, tuple(by_le[b] for b in bounds), count, total)


def scrape(url: str, metric: str = METRIC) -> CumulativeHistogram:
    """Fetch and parse `metric` from the server at `url`."""
    return parse_histogram(fetch_metrics_text(url), metric)


def difference(before: CumulativeHistogram, after: CumulativeHistogram) -> dict:
    """Steps observed between two scrapes, as the stored (non-cumulative) histogram dict."""
    if before.bounds != after.bounds:
        raise ValueError(f"bucket bounds changed between scrapes: {before.bounds} vs {after.bounds}")
    delta = [round(a - b) for a, b in zip(after.cumulative, before.cumulative)]
    if any(d < 0 for d in delta):
        raise ValueError("histogram went backwards between scrapes (server restarted?)")
    per_bucket = [delta[0]] + [delta[i] - delta[i - 1] for i in range(1, len(delta))]
    return {
        "buckets": [("+Inf" if math.isinf(b) else b) for b in before.bounds],
        "counts": per_bucket,
        "count": round(after.count - before.count),
        "sum": after.total - before.total,
    }


def accumulate(into: dict | None, add: dict) -> dict:
    """Sum of two stored histograms with the same buckets (`into` None: a copy of `add`)."""
    if into is None:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in add.items()}
    if into["buckets"] != add["buckets"]:
        raise ValueError("cannot add histograms with different buckets")
    return {
        "buckets": list(into["buckets"]),
        "counts": [a + b for a, b in zip(into["counts"], add["counts"])],
        "count": into["count"] + add["count"],
        "sum": into["sum"] + add["sum"],
    }
