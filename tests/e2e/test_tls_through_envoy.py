"""The ext_proc leg over TLS through a real Envoy: `epp serve --secure-serving` (its
self-signed certificate) behind deploy/envoy/envoy-tls.yaml's cluster (UpstreamTlsContext,
health checks over TLS on the ext_proc port). Requests are routed, and Envoy's own
counters show the ext_proc cluster did TLS handshakes (so the test cannot pass over
plaintext)."""

from __future__ import annotations

import json
import re
import urllib.request

from epp.harness.localstack import LocalStack

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post(url: str) -> tuple[int, dict]:
    body = json.dumps({"model": "tiny", "prompt": "hello over tls", "max_tokens": 4}).encode()
    req = urllib.request.Request(
        url + "/v1/completions", body, {"content-type": "application/json"}
    )
    with _NO_PROXY.open(req, timeout=30) as r:
        return r.status, json.load(r)


def counter(stats: str, name: str) -> int:
    m = re.search(rf"^{re.escape(name)}: (\d+)$", stats, re.M)
    return int(m.group(1)) if m else 0


def test_requests_route_over_tls_to_the_epp(tmp_path):
    with LocalStack(n_sims=2, epp_tls=True, run_dir=tmp_path) as stack:
        assert stack.pg is not None
        epp = next(p for p in stack.pg.processes if p.name == "epp")
        assert "over TLS (self-signed certificate)" in epp.output()
        for _ in range(5):
            status, body = post(stack.url)
            assert status == 200 and body["choices"]
        assert stack.envoy is not None
        stats = stack.envoy.admin("/stats?filter=^cluster.ext_proc.")
        assert counter(stats, "cluster.ext_proc.ssl.handshake") >= 1
        assert counter(stats, "cluster.ext_proc.upstream_rq_total") >= 5
        assert counter(stats, "cluster.ext_proc.health_check.success") >= 1
