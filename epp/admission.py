"""Admission: priorities from objectives, and shedding sheddable requests when saturated.

GIE's legacy admission (`pkg/epp/requestcontrol/admission.go`, gie-epp.md §5.1-5.2): a
request's priority is its `InferenceObjective`'s `spec.priority`, chosen by the header
`x-gateway-inference-objective` (unknown or absent → 0); priority < 0 is sheddable; a
sheddable request is refused with 429 when the saturation detector says ≥ 1.0. Requests
with priority ≥ 0 are never shed here (they queue on the model servers, or in flow control).

Objectives come from a YAML file (`epp serve --objectives FILE`), either

    objectives:
    - {name: critical, priority: 100}
    - {name: batch, priority: -1}

or one or more `kind: InferenceObjective` documents (metadata.name, spec.priority), so the
cluster's own manifests can be pointed at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import yaml

from epp.config.errors import ConfigError
from epp.datastore import EndpointSnapshot
from epp.errors import EppError
from epp.request import InferenceRequest


@runtime_checkable
class SaturationDetector(Protocol):
    """A plugin that says how saturated a set of endpoints is (≥ 1.0: saturated)."""

    name: str

    def saturation(self, endpoints: Sequence[EndpointSnapshot]) -> float: ...


def overloaded(message: str) -> EppError:
    return EppError(429, message, "too_many_requests")


@dataclass(frozen=True)
class Objectives:
    """Objective name → priority; anything else has priority 0 (upstream's default)."""

    priorities: Mapping[str, int] = field(default_factory=dict)

    def priority(self, request: InferenceRequest) -> int:
        return self.priorities.get(request.objective or "", 0)


def parse_objectives(docs: Sequence[Any], source: str) -> Objectives:
    out: dict[str, int] = {}

    def add(name: Any, prio: Any, path: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{path}.name", "must be a non-empty string", source)
        if not isinstance(prio, int) or isinstance(prio, bool):
            raise ConfigError(f"{path}.priority", f"must be an integer, got {prio!r}", source)
        if name in out:
            raise ConfigError(f"{path}.name", f"objective {name!r} is defined twice", source)
        out[name] = prio

    for d, doc in enumerate(docs):
        if doc is None or (isinstance(doc, Mapping) and doc.get("kind") == "InferenceModelRewrite"):
            continue  # one manifest may hold rewrites too (epp serve --model-rewrites)
        if isinstance(doc, Mapping) and doc.get("kind") == "InferenceObjective":
            meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
            add(meta.get("name"), spec.get("priority", 0), f"[{d}].metadata")
        elif isinstance(doc, Mapping) and isinstance(doc.get("objectives"), list):
            for i, item in enumerate(doc["objectives"]):
                if not isinstance(item, Mapping) or set(item) - {"name", "priority"}:
                    raise ConfigError(
                        f"objectives[{i}]", "must be a mapping of name and priority", source
                    )
                add(item.get("name"), item.get("priority", 0), f"objectives[{i}]")
        else:
            raise ConfigError(
                f"[{d}]",
                "expected `objectives: [{name, priority}]` or an InferenceObjective document",
                source,
            )
    return Objectives(out)


def load_objectives_file(path: str | Path) -> Objectives:
    try:
        docs = list(yaml.safe_load_all(Path(path).read_text(encoding="utf-8")))
    except OSError as e:
        raise ConfigError(
            "", f"cannot read objectives file: {e.strerror or e}", str(path)
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError("", f"not valid YAML: {e}", str(path)) from None
    return parse_objectives(docs, str(path))


class Admission:
    """Sheds a sheddable request (priority < 0) when `detector` reports saturation."""

    def __init__(self, detector: SaturationDetector | None, objectives: Objectives) -> None:
        self.detector = detector
        self.objectives = objectives

    def admit(self, request: InferenceRequest, candidates: Sequence[EndpointSnapshot]) -> int:
        """The request's priority; raises EppError(429) if it is shed."""
        priority = self.objectives.priority(request)
        if priority < 0 and self.detector is not None:
            s = self.detector.saturation(candidates)
            if s >= 1.0:
                raise overloaded(
                    f"the pool is saturated ({s:.2f} by {self.detector.name}) and objective "
                    f"{request.objective!r} is sheddable (priority {priority}); retry later"
                )
        return priority
