"""Pods and InferencePools → endpoints: the pure rules, and the discovery flags."""

from __future__ import annotations

import argparse

import pytest

from epp.datalayer.k8s_cli import add_arguments, source_from_args
from epp.datalayer.k8s_pods import (
    PoolSpec,
    PoolSpecError,
    parse_label_selector,
    parse_target_ports,
    pod_endpoints,
    pod_is_ready,
    pods_to_endpoints,
    pool_spec,
)
from epp.datastore import Endpoint


def pod(
    name: str,
    ip: str | None = "10.0.0.1",
    ready: str = "True",
    labels: dict[str, str] | None = None,
    deleting: bool = False,
) -> dict:
    meta: dict = {"name": name, "labels": labels or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T00:00:00Z"
    status: dict = {"conditions": [{"type": "Ready", "status": ready}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


def test_only_ready_pods_with_an_ip_that_are_not_terminating_count() -> None:
    assert pod_is_ready(pod("a"))
    assert not pod_is_ready(pod("a", ready="False"))
    assert not pod_is_ready(pod("a", ip=None))  # scheduled, no IP yet
    assert not pod_is_ready(pod("a", deleting=True))  # terminating: leaves at once
    no_conditions = pod("a")
    no_conditions["status"]["conditions"] = []
    assert not pod_is_ready(no_conditions)


def test_one_port_names_the_endpoint_after_the_pod_and_keeps_its_labels() -> None:
    labels = {"llm-d.ai/role": "decode", "app": "vllm"}
    (ep,) = pod_endpoints(pod("vllm-0", "10.0.0.7", labels=labels), [8000])
    assert ep == Endpoint("vllm-0", "10.0.0.7", 8000, labels)
    assert ep.role == "decode"


def test_several_ports_are_several_endpoints_named_pod_port() -> None:
    eps = pod_endpoints(pod("dp", "10.0.0.9"), [8000, 8001, 8002])
    assert [(e.name, e.hostport) for e in eps] == [
        ("dp-8000", "10.0.0.9:8000"),
        ("dp-8001", "10.0.0.9:8001"),
        ("dp-8002", "10.0.0.9:8002"),
    ]


def test_pool_is_sorted_and_skips_unready_pods() -> None:
    pods = [pod("b", "10.0.0.2"), pod("c", ready="False"), pod("a", "10.0.0.1")]
    assert [e.name for e in pods_to_endpoints(pods, [8000])] == ["a", "b"]


def test_ipv6_pod_ip() -> None:
    (ep,) = pod_endpoints(pod("v6", "fd00::5"), [8000])
    assert ep.hostport == "[fd00::5]:8000"


def pool(spec: dict) -> dict:
    return {"metadata": {"name": "p", "namespace": "llm"}, "spec": spec}


def test_pool_spec_reads_selector_and_target_ports() -> None:
    spec = pool_spec(
        pool(
            {
                "selector": {"matchLabels": {"b": "2", "a": "1"}},
                "targetPorts": [{"number": 8000}, {"number": 8001}],
            }
        )
    )
    assert spec == PoolSpec(selector=(("a", "1"), ("b", "2")), ports=(8000, 8001))
    assert spec.selector_text == "a=1,b=2"


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (
            {"targetPorts": [{"number": 8000}]},
            "InferencePool llm/p has no spec.selector.matchLabels",
        ),
        ({"selector": {}, "targetPorts": [{"number": 8000}]}, "no spec.selector.matchLabels"),
        ({"selector": {"matchLabels": {"a": "1"}}}, "has no spec.targetPorts"),
        (
            {"selector": {"matchLabels": {"a": "1"}}, "targetPorts": [{"number": "x"}]},
            "targetPorts[0].number",
        ),
        (
            {"selector": {"matchLabels": {"a": "1"}}, "targetPorts": [{"number": 80}] * 2},
            "given twice",
        ),
    ],
)
def test_pool_spec_errors_name_the_object_and_field(spec: dict, fragment: str) -> None:
    with pytest.raises(PoolSpecError) as e:
        pool_spec(pool(spec))
    assert fragment in str(e.value)


def test_label_selector_and_ports_parsing() -> None:
    assert parse_label_selector("app=vllm, tier==a") == {"app": "vllm", "tier": "a"}
    for bad in ("", "app", "app!=x", "a=1,a=2"):
        with pytest.raises(PoolSpecError, match="--endpoint-selector"):
            parse_label_selector(bad)
    assert parse_target_ports("8000,8001") == (8000, 8001)
    for bad in ("", "x", "0", "8000,8000", ",".join(str(8000 + i) for i in range(9))):
        with pytest.raises(PoolSpecError, match="--endpoint-target-ports"):
            parse_target_ports(bad)


def args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoints")
    p.add_argument("--endpoint", action="append", default=[])
    add_arguments(p)
    return p.parse_args(argv)


def test_flags_choose_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NAMESPACE", raising=False)
    assert source_from_args(args()) is None
    s = source_from_args(args("--pool-name", "pool-a", "--pool-namespace", "llm"))
    assert s is not None and (s.pool_name, s.namespace, s.selector) == ("pool-a", "llm", None)
    monkeypatch.setenv("NAMESPACE", "from-env")  # upstream's fallback, then "default"
    s = source_from_args(args("--endpoint-selector", "app=vllm", "--endpoint-target-ports", "8000"))
    assert s is not None and s.namespace == "from-env"
    assert s.selector == PoolSpec(selector=(("app", "vllm"),), ports=(8000,))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--pool-name", "p", "--endpoint-selector", "a=b"], "not both"),
        (["--pool-name", "p", "--endpoint", "a=127.0.0.1:1"], "exclusive"),
        (["--endpoint-selector", "a=b"], "needs --endpoint-target-ports"),
        (["--pool-name", "p", "--endpoint-target-ports", "8000"], "goes with --endpoint-selector"),
        (["--pool-namespace", "llm"], "--pool-namespace needs --pool-name"),
        (["--pool-name", " "], "non-empty"),
    ],
)
def test_flag_mistakes_are_one_clear_error(argv: list[str], fragment: str) -> None:
    with pytest.raises(PoolSpecError) as e:
        source_from_args(args(*argv))
    assert fragment in str(e.value)
