"""`label-selector-filter`: keep endpoints whose labels match a Kubernetes label selector.

Semantics are Kubernetes' (`matchLabels` AND every `matchExpressions` entry); an empty
selector matches everything. Upstream llm-d's old name `by-label-selector` is an alias.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class Requirement:
    key: str = param()
    operator: str = param(choices=OPERATORS)
    values: list[str] = param(default_factory=list)

    def validate(self) -> None:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs a non-empty 'values' list")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no 'values'")

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        if op == "In":
            return labels.get(self.key) in self.values
        return self.key not in labels or labels[self.key] not in self.values  # NotIn


@dataclass(frozen=True)
class Selector:
    match_labels: dict[str, str] = field(default_factory=dict)
    match_expressions: list[Requirement] = field(default_factory=list)

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.match_labels.items():
            if labels.get(k) != v:
                return False
        return all(r.matches(labels) for r in self.match_expressions)


@register("label-selector-filter", aliases=("by-label-selector",))
class LabelSelectorFilter(Plugin):
    Params = Selector

    def __init__(self, name: str, params: Selector, handle: Handle) -> None:
        super().__init__(name)
        self.selector = params

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[EndpointSnapshot]:
        return [e for e in endpoints if self.selector.matches(e.endpoint.labels)]
