"""deploy/kubernetes: valid YAML, consistent references, copies equal to their sources, and
container arguments that the real `epp` parsers accept."""

import argparse
from pathlib import Path

import pytest
import yaml

from epp.cli import build_parser
from epp.config.loader import load_config_text
from epp.sidecar.cli import options_from_args

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
ROLE = "llm-d.ai/role"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d is not None]


def all_docs() -> list[dict]:
    kustomization = docs("kustomization.yaml")[0]
    return [d for f in kustomization["resources"] for d in docs(f)]


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in all_docs() if d["kind"] == kind}


def containers(deployment: dict) -> dict[str, dict]:
    spec = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def parse(argv: list[str]) -> argparse.Namespace:
    parser, _ = build_parser(argv)
    return parser.parse_args(argv)


def test_every_manifest_parses_and_kustomization_lists_them_all():
    listed = set(docs("kustomization.yaml")[0]["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    for d in all_docs():
        assert d["apiVersion"] and d["kind"] and d["metadata"]["name"]


def test_prefill_and_decode_deployments_carry_their_roles_and_selectors_match():
    deployments = by_kind("Deployment")
    roles = {}
    for name, d in deployments.items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        selector = d["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), name
        if ROLE in labels:
            roles[name] = labels[ROLE]
            assert labels["app.kubernetes.io/part-of"] == "epp-pd"
    assert sorted(roles.values()) == ["decode", "prefill"]
    service = by_kind("Service")["epp-gateway"]
    epp_labels = deployments["epp"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= epp_labels.items()


def test_volumes_and_config_maps_referenced_exist():
    config_maps = set(by_kind("ConfigMap"))
    for name, d in by_kind("Deployment").items():
        spec = d["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            if "configMap" in v:
                assert v["configMap"]["name"] in config_maps, (name, v)
        for c in containers(d).values():
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, (name, c["name"], mount)
        account = spec.get("serviceAccountName")
        if account:
            assert account in by_kind("ServiceAccount")


def test_config_map_copies_equal_their_sources_and_the_epp_config_loads():
    import importlib.util

    spec = importlib.util.spec_from_file_location("render", DEPLOY / "render_configmaps.py")
    assert spec is not None and spec.loader is not None
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    assert (DEPLOY / "configmaps.yaml").read_text() == render.render(), (
        "configmaps.yaml is stale: run python deploy/kubernetes/render_configmaps.py"
    )
    cms = by_kind("ConfigMap")
    pd = cms["epp-config"]["data"]["pd-disagg.yaml"]
    assert pd == (ROOT / "config" / "pd-disagg.yaml").read_text()
    assert load_config_text(pd).scheduler.handler.type_name == "disagg-profile-handler"
    envoy = cms["envoy-config"]["data"]["envoy.yaml"]
    assert envoy == (ROOT / "deploy" / "envoy" / "envoy.yaml").read_text()
    assert yaml.safe_load(cms["epp-pool"]["data"]["pool.yaml"]) == []
    script = (DEPLOY / "discover-pool.sh").read_text()
    assert cms["epp-pool-discovery"]["data"]["discover-pool.sh"] == script


def test_decode_pods_run_the_sidecar_in_front_of_vllm():
    decode = containers(by_kind("Deployment")["vllm-decode"])
    sidecar, vllm = decode["sidecar"], decode["vllm"]
    args = parse(sidecar["args"])
    options = options_from_args(args)
    assert options.port == 8000 and options.decode_url == "http://127.0.0.1:8001"
    assert options.allow_from_endpoints == "/etc/epp-pool/pool.yaml"
    assert "--port=8001" in vllm["args"]
    assert any("NixlConnector" in a for a in vllm["args"])
    prefill = containers(by_kind("Deployment")["vllm-prefill"])["vllm"]
    assert "--port=8000" in prefill["args"]  # the port the pool discovery lists


def test_the_epp_container_arguments_are_what_epp_serve_accepts():
    epp = containers(by_kind("Deployment")["epp"])
    args = parse(epp["epp"]["args"])
    assert args.config == "/etc/epp/pd-disagg.yaml"
    assert args.endpoints == "/var/run/epp-pool/pool.yaml"
    mounts = {m["mountPath"] for m in epp["epp"]["volumeMounts"]}
    assert {"/etc/epp", "/var/run/epp-pool"} <= mounts
    assert epp["envoy"]["command"][:3] == ["envoy", "-c", "/etc/envoy/envoy.yaml"]


@pytest.mark.parametrize("kind", ["Role", "RoleBinding"])
def test_rbac_is_namespaced_and_minimal(kind):
    (obj,) = by_kind(kind).values()
    assert "namespace" not in obj["metadata"]  # `kubectl apply -k ... -n NS` decides
    if kind == "Role":
        verbs = {v for rule in obj["rules"] for v in rule["verbs"]}
        assert verbs <= {"get", "list", "patch", "update"}
