"""InferenceModelRewrite (epp/rewrite.py): upstream's precedence, the weighted split, the
same target for the same request id, and the errors a broken resource gets."""

import random
import uuid

import pytest
import yaml

from epp.admission import parse_objectives
from epp.config.errors import ConfigError
from epp.rewrite import ModelRewrites, load_rewrites_file, parse_rewrite, parse_rewrite_docs

# Shaped as llm-d-router's CRD (config/crd/bases/llm-d.ai_inferencemodelrewrites.yaml).
CANARY = """
apiVersion: llm-d.ai/v1alpha2
kind: InferenceModelRewrite
metadata: {name: llama-canary, creationTimestamp: "2026-01-02T00:00:00Z"}
spec:
  poolRef: {group: inference.networking.k8s.io, name: default}
  rules:
  - matches: [{model: {type: Exact, value: llama}}]
    targets:
    - {modelRewrite: llama-v1, weight: 90}
    - {modelRewrite: llama-v2, weight: 10}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 100, poolRef: {name: default}}
"""


def rewrite(name: str, created: str, rules: list[dict], api: str = "llm-d.ai/v1alpha2"):
    doc = {
        "apiVersion": api,
        "kind": "InferenceModelRewrite",
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"poolRef": {"name": "pool"}, "rules": rules},
    }
    return parse_rewrite(doc, name)


def exact(model: str, *targets: str) -> dict:
    return {
        "matches": [{"model": {"value": model}}],
        "targets": [{"modelRewrite": t} for t in targets],
    }


def test_weighted_split_is_within_2_percent_over_10k_requests():
    table = ModelRewrites.build(parse_rewrite_docs(list(yaml.safe_load_all(CANARY)), "t"))
    rng = random.Random(7)  # request ids as Envoy makes them (UUIDs), seeded
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(10_000)]
    picks = [table.target("llama", rid) for rid in ids]
    assert abs(picks.count("llama-v2") / len(picks) - 0.10) <= 0.02  # within 2 points
    assert abs(picks.count("llama-v1") / len(picks) - 0.90) <= 0.02


@pytest.mark.parametrize("weights", [(1, 1), (70, 20, 10), (1, 999)])
def test_split_follows_any_weights(weights):
    targets = [{"modelRewrite": f"m{i}", "weight": w} for i, w in enumerate(weights)]
    table = ModelRewrites.build([rewrite("r", "", [{"targets": targets}])])
    n = 10_000
    picks = [table.target("anything", f"req-{i}") for i in range(n)]
    for i, w in enumerate(weights):
        assert abs(picks.count(f"m{i}") / n - w / sum(weights)) <= 0.02


def test_a_retried_request_keeps_its_target():
    table = ModelRewrites.build(parse_rewrite_docs(list(yaml.safe_load_all(CANARY)), "t"))
    for i in range(200):
        rid = f"retry-{i}"
        assert len({table.target("llama", rid) for _ in range(5)}) == 1


def test_exact_beats_generic_and_the_oldest_resource_wins():
    generic = rewrite("generic", "2026-01-01T00:00:00Z", [{"targets": [{"modelRewrite": "g"}]}])
    old = rewrite("old", "2026-01-02T00:00:00Z", [exact("a", "old-a")])
    new = rewrite("new", "2026-01-03T00:00:00Z", [exact("a", "new-a"), exact("b", "new-b")])
    table = ModelRewrites.build([new, generic, old])
    assert table.target("a", "x") == "old-a"  # exact, oldest resource
    assert table.target("b", "x") == "new-b"
    assert table.target("c", "x") == "g"  # no exact rule: the generic one
    assert ModelRewrites.build([old]).target("c", "x") is None  # no rule: unchanged


def test_first_matching_rule_within_a_resource_wins():
    r = rewrite("r", "", [exact("a", "first"), exact("a", "second")])
    assert ModelRewrites.build([r]).target("a", "x") == "first"


def test_the_llm_d_group_wins_a_name_the_legacy_group_also_uses():
    legacy = rewrite(
        "same", "", [exact("a", "legacy")], api="inference.networking.x-k8s.io/v1alpha2"
    )
    current = rewrite("same", "", [exact("a", "current")])
    assert legacy.legacy and not current.legacy
    assert ModelRewrites.build([legacy, current]).target("a", "x") == "current"
    assert ModelRewrites.build([current, legacy]).target("a", "x") == "current"
    assert ModelRewrites.build([legacy]).target("a", "x") == "legacy"


@pytest.mark.parametrize(
    ("rules", "field"),
    [
        ([{"targets": [{"modelRewrite": "a", "weight": 1}, {"modelRewrite": "b"}]}], "targets"),
        ([{"targets": [{"modelRewrite": "a", "weight": 0}]}], "targets[0].weight"),
        ([{"targets": [{"weight": 3}]}], "targets[0].modelRewrite"),
        ([{"targets": []}], "targets"),
        ([{"matches": [{"model": {"type": "Regex", "value": "x"}}],
           "targets": [{"modelRewrite": "a"}]}], "matches[0].model.type"),
        ([{"targets": [{"modelRewrite": "a"}], "filters": []}], "filters"),
    ],
)  # fmt: skip
def test_a_broken_rule_names_the_field(rules, field):
    with pytest.raises(ConfigError) as e:
        rewrite("bad", "", rules)
    assert e.value.path.endswith(field), e.value.path


def test_a_manifest_with_objectives_and_rewrites_loads_both(tmp_path):
    path = tmp_path / "resources.yaml"
    path.write_text(CANARY)
    rewrites = load_rewrites_file(path)
    assert [r.name for r in rewrites] == ["llama-canary"] and rewrites[0].pool == "default"
    objectives = parse_objectives(list(yaml.safe_load_all(CANARY)), str(path))
    assert objectives.priorities == {"critical": 100}


def test_a_file_without_rewrites_says_so(tmp_path):
    path = tmp_path / "none.yaml"
    path.write_text("kind: InferenceObjective\nmetadata: {name: x}\nspec: {priority: 1}\n")
    with pytest.raises(ConfigError, match="no InferenceModelRewrite document"):
        load_rewrites_file(path)


def test_an_unmatched_model_through_a_generic_rule_is_counted_as_other():
    from epp.observability import REGISTRY

    table = ModelRewrites.build([rewrite("catch-all", "", [{"targets": [{"modelRewrite": "t"}]}])])
    table.target("client-chosen-name-" + "x" * 50, "r")
    value = REGISTRY.get_sample_value(
        "llm_d_epp_model_rewrite_decisions_total",
        {"model_rewrite_name": "catch-all", "model_name": "other", "target_model": "t"},
    )
    assert value == 1
