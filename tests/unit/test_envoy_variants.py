"""deploy/envoy's variants: TLS to the EPP (envoy-tls.yaml) and two EPPs in one ext_proc
cluster (envoy-replicas.yaml), the response on an observability-mode filter
(envoy-observer.yaml). Each is generated from envoy.yaml by deploy/envoy/render.py
(text edits that keep the comments) and must equal what the harness builds for the same
options (`epp.harness.envoy.render`), so tests exercise exactly what ships; each passes
`envoy --mode validate`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from epp.harness.envoy import EnvoyOptions, render, response_path_options, validate_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "envoy"


def renderer():
    spec = importlib.util.spec_from_file_location("envoy_render", DEPLOY / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_variants_are_fresh():
    for path, text in renderer().outputs().items():
        assert path.read_text() == text, f"{path.name} is stale: run python deploy/envoy/render.py"


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("envoy-tls.yaml", EnvoyOptions(epp_tls=True)),
        ("envoy-replicas.yaml", EnvoyOptions(extra_epps=((9012, 9013),))),
        ("envoy-observer.yaml", EnvoyOptions(**response_path_options("observer"))),
        ("envoy-inpath.yaml", EnvoyOptions(**response_path_options("on"))),
        ("envoy.yaml", EnvoyOptions()),
    ],
)
def test_each_variant_is_what_the_harness_renders(name, options):
    # EnvoyOptions' defaults are the file's placeholders (8081, 9901, 127.0.0.1:9002/9003).
    assert yaml.safe_load((DEPLOY / name).read_text()) == render(options)


@pytest.mark.parametrize(
    "name",
    [
        "envoy.yaml",
        "envoy-tls.yaml",
        "envoy-replicas.yaml",
        "envoy-observer.yaml",
        "envoy-inpath.yaml",
    ],
)
def test_envoy_accepts_each_variant(name):
    validate_config(DEPLOY / name)


def test_tls_variant_encrypts_and_health_checks_the_ext_proc_port():
    cluster = next(
        c
        for c in yaml.safe_load((DEPLOY / "envoy-tls.yaml").read_text())["static_resources"][
            "clusters"
        ]
        if c["name"] == "ext_proc"
    )
    socket = cluster["transport_socket"]
    assert socket["name"] == "envoy.transport_sockets.tls"
    assert socket["typed_config"]["@type"].endswith("UpstreamTlsContext")
    [endpoint] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert "health_check_config" not in endpoint["endpoint"]  # not the plaintext health port
