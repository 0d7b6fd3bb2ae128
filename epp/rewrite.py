"""InferenceModelRewrite: a request's model name → the model the pool is asked for.

The resource is llm-d-router's (`apix/v1alpha2/inferencemodelrewrite_types.go`, group
`llm-d.ai/v1alpha2`; GIE's `inference.networking.x-k8s.io/v1alpha2` is its deprecated
old home, read too):

    apiVersion: llm-d.ai/v1alpha2
    kind: InferenceModelRewrite
    metadata: {name: canary}
    spec:
      poolRef: {group: inference.networking.k8s.io, name: my-pool}
      rules:
      - matches: [{model: {type: Exact, value: llama}}]   # none: every model
        targets:
        - {modelRewrite: llama-v1, weight: 90}
        - {modelRewrite: llama-v2, weight: 10}

Precedence as upstream documents it (`pkg/epp/datastore/modelrewritestore.go`): a rule
with an exact match beats a generic one (no `matches`); among those, the oldest resource
(`metadata.creationTimestamp`) wins; within one resource, the first rule. The winning
rule's targets split the model's traffic by weight (weight / sum of weights; all
unweighted: equal shares). The rule overrides the `x-gateway-model-name-rewrite` header,
as upstream's director does; without a rule the header still applies.

Where this differs from upstream, and why: upstream picks a target with `rand.Intn`, so a
retried request (same `x-request-id`) can land on another model mid-conversation or
mid-canary; here the pick is a hash of the request id (blake2b, 64 bits, mod the sum of
weights), so a retry keeps its target and the split still follows the weights. Upstream
accepts weights on some targets only and then never selects the unweighted ones (a
runtime warning); its API says weights are all set or none, so such a resource is refused
here, naming the field. Upstream ignores every legacy-group resource once the `llm-d.ai`
CRD is installed; here both are read and the `llm-d.ai` one wins a name they share, so a
migration does not drop the rewrites not yet moved.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import Counter

from epp.config.errors import ConfigError
from epp.observability import REGISTRY

log = logging.getLogger(__name__)

KIND = "InferenceModelRewrite"
GROUP = "llm-d.ai"
LEGACY_GROUP = "inference.networking.x-k8s.io"
POOL_GROUP = "inference.networking.k8s.io"  # a poolRef's default group (upstream's CRD)
MAX_WEIGHT = 1_000_000  # the CRD's bound

# llm-d-router's `model_rewrite_decisions_total` (docs/metrics.md): names come from the
# operator's resources, never from the client (an unmatched model is not counted).
REWRITE_DECISIONS = Counter(
    "llm_d_epp_model_rewrite_decisions",
    "Model-rewrite decisions by InferenceModelRewrite, incoming model and chosen target.",
    ["model_rewrite_name", "model_name", "target_model"],
    registry=REGISTRY,
)


@dataclass(frozen=True, slots=True)
class Target:
    model: str
    weight: int  # 1 when the resource gives no weights (equal shares)


@dataclass(frozen=True, slots=True)
class Rule:
    source: str  # the InferenceModelRewrite's name
    models: frozenset[str]  # exact matches; empty: matches every model
    targets: tuple[Target, ...]
    total: int  # sum of the weights

    def pick(self, request_id: str) -> Target:
        """The target for this request: the same id always gets the same target."""
        if len(self.targets) == 1:
            return self.targets[0]
        h = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")
        x = h % self.total
        for t in self.targets:
            if x < t.weight:
                return t
            x -= t.weight
        return self.targets[-1]  # unreachable: x < total


@dataclass(frozen=True, slots=True)
class Rewrite:
    """One InferenceModelRewrite resource, checked."""

    name: str
    created: str  # RFC 3339 (sorts as time); "" sorts first
    pool: str  # spec.poolRef.name
    pool_group: str
    rules: tuple[Rule, ...]
    legacy: bool = False  # from inference.networking.x-k8s.io


def parse_rewrite(doc: Mapping[str, Any], where: str) -> Rewrite:
    """One resource (a dict as YAML or the API server gives it) → Rewrite; ConfigError
    naming the field otherwise."""
    meta = doc.get("metadata") or {}
    spec = doc.get("spec")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.metadata.name", "must be a non-empty string")
    path = f"{where} ({name})"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{path}.spec", "must be a mapping with poolRef and rules")
    pool_ref = spec.get("poolRef")
    if not isinstance(pool_ref, Mapping) or not isinstance(pool_ref.get("name"), str):
        raise ConfigError(f"{path}.spec.poolRef.name", "is required (the InferencePool's name)")
    rules_doc = spec.get("rules")
    if not isinstance(rules_doc, list) or not rules_doc:
        raise ConfigError(f"{path}.spec.rules", "must be a non-empty list")
    rules = tuple(_rule(r, f"{path}.spec.rules[{i}]", name) for i, r in enumerate(rules_doc))
    api = str(doc.get("apiVersion") or "")
    return Rewrite(
        name=name,
        created=str(meta.get("creationTimestamp") or ""),
        pool=pool_ref["name"],
        pool_group=str(pool_ref.get("group") or POOL_GROUP),
        rules=rules,
        legacy=api.startswith(LEGACY_GROUP + "/"),
    )


def _rule(doc: Any, path: str, source: str) -> Rule:
    if not isinstance(doc, Mapping):
        raise ConfigError(path, "must be a mapping with matches and targets")
    unknown = set(doc) - {"matches", "targets"}
    if unknown:
        raise ConfigError(f"{path}.{sorted(unknown)[0]}", "unknown field (matches, targets)")
    models: set[str] = set()
    for j, m in enumerate(doc.get("matches") or ()):
        model = m.get("model") if isinstance(m, Mapping) else None
        if not isinstance(model, Mapping) or not isinstance(model.get("value"), str):
            raise ConfigError(f"{path}.matches[{j}].model.value", "is required")
        kind = model.get("type", "Exact")
        if kind != "Exact":
            raise ConfigError(f"{path}.matches[{j}].model.type", f"only Exact, got {kind!r}")
        models.add(model["value"])
    targets_doc = doc.get("targets")
    if not isinstance(targets_doc, list) or not targets_doc:
        raise ConfigError(f"{path}.targets", "must list at least one {modelRewrite, weight}")
    weighted = [isinstance(t, Mapping) and "weight" in t for t in targets_doc]
    if any(weighted) and not all(weighted):
        raise ConfigError(
            f"{path}.targets",
            "set a weight on every target or on none (the API's rule; upstream would never "
            "select the unweighted ones)",
        )
    targets = []
    for j, t in enumerate(targets_doc):
        tpath = f"{path}.targets[{j}]"
        if not isinstance(t, Mapping) or not isinstance(t.get("modelRewrite"), str):
            raise ConfigError(f"{tpath}.modelRewrite", "is required (the model to ask for)")
        w = t.get("weight", 1)
        if not isinstance(w, int) or isinstance(w, bool) or not 1 <= w <= MAX_WEIGHT:
            raise ConfigError(f"{tpath}.weight", f"must be an integer 1..{MAX_WEIGHT}, got {w!r}")
        targets.append(Target(t["modelRewrite"], w))
    return Rule(source, frozenset(models), tuple(targets), sum(t.weight for t in targets))


@dataclass(frozen=True)
class ModelRewrites:
    """The pool's rewrite rules by precedence; immutable (replaced whole on a change), so
    a worker thread parsing a request may read it while the loop installs a new one."""

    exact: Mapping[str, Rule] = field(default_factory=dict)
    generic: Rule | None = None
    names: tuple[str, ...] = ()
    _counters: dict[tuple[str, str, str], Any] = field(default_factory=dict, compare=False)

    @classmethod
    def build(cls, rewrites: Iterable[Rewrite]) -> ModelRewrites:
        """Upstream's precedence: oldest resource first, then rule order; the first rule
        seen for a model (or the first generic one) wins. A legacy-group resource whose
        name an `llm-d.ai` one also uses is dropped."""
        chosen: dict[str, Rewrite] = {}
        for r in rewrites:
            have = chosen.get(r.name)
            if have is None or (have.legacy and not r.legacy):
                chosen[r.name] = r
        ordered = sorted(chosen.values(), key=lambda r: (r.created, r.name))
        exact: dict[str, Rule] = {}
        generic: Rule | None = None
        for r in ordered:
            for rule in r.rules:
                if not rule.models:
                    generic = generic or rule
                for model in rule.models:
                    exact.setdefault(model, rule)
        return cls(exact, generic, tuple(r.name for r in ordered))

    def __bool__(self) -> bool:
        return bool(self.exact) or self.generic is not None

    def target(self, model: str, request_id: str) -> str | None:
        """The model to ask the pool for, or None when no rule matches `model`."""
        rule = self.exact.get(model) or self.generic
        if rule is None:
            return None
        target = rule.pick(request_id).model
        key = (rule.source, model, target)
        counter = self._counters.get(key)
        if counter is None:
            # An unmatched model reaches here only through a generic rule: its name is
            # client text, so it is counted as "other" (the label set stays bounded).
            label = model if model in self.exact else "other"
            counter = self._counters[key] = REWRITE_DECISIONS.labels(rule.source, label, target)
        counter.inc()
        return target


def rewrites_for_pool(
    rewrites: Iterable[Rewrite], pool: str | None, pool_group: str = POOL_GROUP
) -> list[Rewrite]:
    """The resources that name this pool (upstream's `eventPredicate`: poolRef name and
    group). `pool` None (no pool name given): all of them."""
    return [r for r in rewrites if pool is None or (r.pool == pool and r.pool_group == pool_group)]


def parse_rewrite_docs(docs: Sequence[Any], source: str) -> list[Rewrite]:
    """The InferenceModelRewrite documents of a YAML stream (other kinds are skipped, so
    one manifest can hold objectives and rewrites)."""
    out: list[Rewrite] = []
    for d, doc in enumerate(docs):
        if isinstance(doc, Mapping) and doc.get("kind") == KIND:
            try:
                out.append(parse_rewrite(doc, f"[{d}]"))
            except ConfigError as e:
                raise ConfigError(e.path, e.message, source) from None
    names = [r.name for r in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ConfigError("metadata.name", f"{KIND} {dup!r} is defined twice", source)
    return out


def load_rewrites_file(path: str | Path) -> list[Rewrite]:
    try:
        docs = list(yaml.safe_load_all(Path(path).read_text(encoding="utf-8")))
    except OSError as e:
        why = e.strerror or e
        raise ConfigError("", f"cannot read model rewrites file: {why}", str(path)) from None
    except yaml.YAMLError as e:
        raise ConfigError("", f"not valid YAML: {e}", str(path)) from None
    out = parse_rewrite_docs(docs, str(path))
    if not out:
        raise ConfigError("", f"no {KIND} document found", str(path))
    return out
