"""`LoopHistogram` writes exactly what `prometheus_client.Histogram` writes for the same
observations (names, labels, buckets, _count, _sum; `_created` times aside)."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from epp.loophist import LoopHistogram

BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
# On a bound (0.0001, 0.1: "le" includes it), between bounds, zero, above every bound.
VALUES = (0.0, 0.0001, 0.00015, 0.002, 0.05, 0.1, 0.2, 5.0)


def _without_created_times(text: bytes) -> str:
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text.decode())


def test_exposition_equals_prometheus_client_histogram() -> None:
    ref, ours = CollectorRegistry(), CollectorRegistry()
    labelled_ref = Histogram("x_seconds", "doc", ["a", "b"], buckets=BUCKETS, registry=ref)
    labelled = LoopHistogram("x_seconds", "doc", ["a", "b"], buckets=BUCKETS, registry=ours)
    plain_ref = Histogram("e_seconds", "doc", buckets=BUCKETS, registry=ref)
    plain = LoopHistogram("e_seconds", "doc", buckets=BUCKETS, registry=ours)
    for v in VALUES:
        labelled_ref.labels("p", "q").observe(v)
        labelled.labels(a="p", b="q").observe(v)
        labelled_ref.labels("p", "r").observe(v / 2)
        labelled.labels("p", "r").observe(v / 2)
        plain_ref.observe(v)
        plain.observe(v)
    want = _without_created_times(generate_latest(ref))
    assert _without_created_times(generate_latest(ours)) == want
    # 8 observations: le=0.0001 holds 0.0 and 0.0001 (2), +Inf all 8, sum 5.35225.
    assert 'e_seconds_bucket{le="0.0001"} 2.0' in want
    assert 'e_seconds_bucket{le="+Inf"} 8.0' in want


def test_unlabelled_is_exported_before_any_observation() -> None:
    """As prometheus_client's: an unlabelled histogram shows zero counts from the start
    (the prefix indexer's hit histograms are LoopHistograms; a scrape before the first
    request must read the same)."""
    ref, ours = CollectorRegistry(), CollectorRegistry()
    Histogram("h_ratio", "doc", buckets=(0.0, 0.5, 1.0), registry=ref)
    LoopHistogram("h_ratio", "doc", buckets=(0.0, 0.5, 1.0), registry=ours)
    want = _without_created_times(generate_latest(ref))
    assert _without_created_times(generate_latest(ours)) == want
    assert 'h_ratio_bucket{le="+Inf"} 0.0' in want


def test_labels_are_checked() -> None:
    h = LoopHistogram("y_seconds", "doc", ["a"], buckets=BUCKETS)
    with pytest.raises(ValueError, match="expected labels"):
        h.labels("1", "2")
    with pytest.raises(ValueError, match="expected labels"):
        h.labels(b="1")
    with pytest.raises(ValueError, match="use labels"):
        h.observe(1.0)
    assert h.labels("1") is h.labels(a="1")  # one child per label set


def test_buckets_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        LoopHistogram("z_seconds", "doc", buckets=(0.2, 0.1))
