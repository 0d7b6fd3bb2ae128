"""Upstream's data-layer and parser plugin types, so their configs load unchanged.

`metrics-data-source` carries the scrape scheme and path the EPP's scraper uses;
`core-metrics-extractor` chooses the engine's metric names per endpoint; `openai-parser`
is the only parser (OpenAI JSON). They take part in no scheduling profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.config.params import NoParams, param
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register


@dataclass(frozen=True)
class MetricsSourceParams:
    scheme: str = param("http", choices=("http", "https"), doc="scrape scheme")
    path: str = param("/metrics", doc="scrape path on each endpoint")
    insecure_skip_verify: bool = param(True, doc="skip TLS verification for https")


@register("metrics-data-source")
class MetricsDataSource(Plugin):
    Params = MetricsSourceParams

    def __init__(self, name: str, params: MetricsSourceParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params


@dataclass(frozen=True)
class ExtractorParams:
    engine_label_key: str = param(
        "inference.networking.k8s.io/engine-type", doc="endpoint label naming its engine"
    )
    default_engine: str = param("vllm", choices=("vllm", "sglang"), doc="engine when unlabelled")


@register("core-metrics-extractor")
class CoreMetricsExtractor(Plugin):
    Params = ExtractorParams

    def __init__(self, name: str, params: ExtractorParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params


@register("openai-parser")
class OpenAIParser(Plugin):
    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name)
