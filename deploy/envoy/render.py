"""Regenerate the Envoy variants from deploy/envoy/envoy.yaml (run after editing it):

    python deploy/envoy/render.py

- `envoy-tls.yaml`: the EPP serves TLS (`epp serve --secure-serving` or `--cert-path`):
  the ext_proc cluster gets an UpstreamTlsContext and health-checks the ext_proc port over
  it (the EPP's health port stays plaintext for the kubelet).
- `envoy-replicas.yaml`: two EPP processes on this host (9002/9003 and 9012/9013) in one
  ext_proc cluster; add lb_endpoints for more.
- `envoy-observer.yaml`: the response off the client's path (`epp serve --response-path
  observer`): the routing filter skips the response, a second ext_proc filter in
  observability mode sends it to the EPP without waiting (one EPP per Envoy: see there).

Text edits keep the comments; tests/unit/test_envoy_variants.py checks each variant equals
what `epp.harness.envoy.render` builds for the same options and fails when one is stale.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

_ENDPOINT = """        - endpoint:
            address:
              socket_address: { address: 127.0.0.1, port_value: 9002 }
            health_check_config:
              port_value: 9003
"""
_HEALTH = """      grpc_health_check:
        service_name: envoy.service.ext_proc.v3.ExternalProcessor
"""
_PROTOCOL = """          http2_protocol_options: {}
"""

_TLS_EDITS = [
    (
        _ENDPOINT,
        """        - endpoint:
            address:
              socket_address: { address: 127.0.0.1, port_value: 9002 }
""",
    ),
    (
        _HEALTH,
        _HEALTH
        + """      # Over the cluster's TLS to the ext_proc port (the health port is plaintext).
      tls_options: { alpn_protocols: [h2] }
""",
    ),
    (
        _PROTOCOL,
        _PROTOCOL
        + """    # The EPP serves TLS (epp serve --secure-serving / --cert-path). No validation
    # context: its default certificate is self-signed, so Envoy encrypts without verifying,
    # as GIE's reference config does. For a certificate you issued, add
    # `validation_context: { trusted_ca: { filename: ca.crt } }` and `sni`.
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        common_tls_context: { alpn_protocols: [h2] }
""",
    ),
]

_REPLICA_EDITS = [
    (
        _ENDPOINT,
        _ENDPOINT
        + """        # A second EPP (epp serve --grpc-port 9012 --health-port 9013): every replica
        # routes; Envoy spreads the ext_proc streams over the healthy ones.
        - endpoint:
            address:
              socket_address: { address: 127.0.0.1, port_value: 9012 }
            health_check_config:
              port_value: 9013
""",
    ),
]


_EXT_PROC_TYPE = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_RESPONSE_MODES = """                response_header_mode: SEND
                response_body_mode: FULL_DUPLEX_STREAMED
                response_trailer_mode: SEND
"""

_OBSERVER_EDITS = [
    (
        _RESPONSE_MODES,
        """                # The response goes to the observer filter below, not through this one.
                response_header_mode: SKIP
                response_body_mode: NONE
                response_trailer_mode: SKIP
""",
    ),
    (
        """          - name: envoy.filters.http.router
""",
        """          # The response path off the client's path (epp serve --response-path observer):
          # observability_mode is "send and go": Envoy sends each phase to the EPP and
          # carries on at once, ignoring any answer, so a response chunk reaches the client
          # without a round trip through the EPP (docs/BENCHMARKS.md@a73a134, "Observer response
          # path"). The EPP joins this stream to the routed request by x-epp-route-id, which
          # the filter above set on the request headers this one sees.
          # What Envoy 1.40 sends here (verified against the binary, tests/e2e/test_observer.py):
          #   - a routed request: request_headers (with the routing filter's mutations),
          #     response_headers, every body chunk as it passes (the client has it already),
          #     then an empty chunk with end_of_stream; every message has observability_mode;
          #   - a local reply of the filter above (the EPP's own 4xx/5xx): no request_headers,
          #     only the response (the EPP ignores it: nothing was routed);
          #   - client gone or upstream reset mid-response: the chunks so far, no end_of_stream;
          #   - in every case Envoy half-closes the gRPC stream deferred_close_timeout after
          #     the HTTP stream ends: that is when a cut response is given back (incomplete).
          #     The EPP ends the stream itself once it has the end (or nothing to observe),
          #     as ext_proc.proto allows; the response to the client is unaffected.
          # Envoy has no flow control towards an observer yet (ext_proc.proto, envoy#33319):
          # an EPP slower than the responses makes Envoy buffer what it has not taken.
          # A request whose observer stream never comes is given back by the EPP after 10 s
          # (epp/extproc/handoff.py). One EPP per Envoy: with several in the ext_proc cluster
          # this stream may reach another replica than the one that routed, so
          # envoy-replicas.yaml keeps the response on the routing filter.
          # failure_mode_allow: an observer that fails must never cost the response.
          - name: epp.observer
            typed_config:
              "@type": EXT_PROC_TYPE
              grpc_service:
                envoy_grpc: { cluster_name: ext_proc }
              observability_mode: true
              deferred_close_timeout: 5s
              failure_mode_allow: true
              processing_mode:
                request_header_mode: SEND
                request_body_mode: NONE
                request_trailer_mode: SKIP
                response_header_mode: SEND
                # STREAMED, as ext_proc.proto asks for observability_mode; nothing is buffered.
                response_body_mode: STREAMED
                response_trailer_mode: SEND
          - name: envoy.filters.http.router
""".replace("EXT_PROC_TYPE", "type.googleapis.com/" + _EXT_PROC_TYPE),
    ),
]


def _edit(name: str, note: str, edits: list[tuple[str, str]]) -> str:
    text = (HERE / "envoy.yaml").read_text()
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"deploy/envoy/envoy.yaml changed: cannot find {old.strip()!r}")
        text = text.replace(old, new)
    return f"# Generated by deploy/envoy/render.py from envoy.yaml: {note}\n" + text


def tls_config() -> str:
    return _edit("tls", "the EPP serves TLS (see the ext_proc cluster).", _TLS_EDITS)


def replicas_config() -> str:
    return _edit("replicas", "two EPPs in the ext_proc cluster.", _REPLICA_EDITS)


def observer_config() -> str:
    note = "the response on an observability-mode ext_proc filter."
    return _edit("observer", note, _OBSERVER_EDITS)


def outputs() -> dict[Path, str]:
    return {
        HERE / "envoy-tls.yaml": tls_config(),
        HERE / "envoy-replicas.yaml": replicas_config(),
        HERE / "envoy-observer.yaml": observer_config(),
    }


if __name__ == "__main__":
    for path, text in outputs().items():
        path.write_text(text)
