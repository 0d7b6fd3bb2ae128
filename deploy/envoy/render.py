"""Regenerate the Envoy variants from deploy/envoy/envoy.yaml (run after editing it):

    python deploy/envoy/render.py

- `envoy-tls.yaml`: the EPP serves TLS (`epp serve --secure-serving` or `--cert-path`):
  the ext_proc cluster gets an UpstreamTlsContext and health-checks the ext_proc port over
  it (the EPP's health port stays plaintext for the kubelet).
- `envoy-replicas.yaml`: two EPP processes on this host (9002/9003 and 9012/9013) in one
  ext_proc cluster; add lb_endpoints for more. Each EPP gets its own access logger on its
  own one-host cluster (an access-log stream reaches one host of its cluster; every EPP
  sees every entry and keeps its own).
- `envoy-inpath.yaml`: the response through the EPP (`epp serve --response-path on`):
  every response chunk is a gRPC round trip; no Lua filter, no access log.
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


_LOGGER = """                grpc_service:
                  envoy_grpc: { cluster_name: ext_proc }
                buffer_flush_interval: 0.010s
"""


def _logger_for(index: int) -> str:
    return _LOGGER.replace("cluster_name: ext_proc", f"cluster_name: epp_log_{index}")


def _log_cluster(index: int, port: int) -> str:
    return f"""
  # The access log to EPP {index} alone (see the access_log above).
  - name: epp_log_{index}
    type: STATIC
    connect_timeout: 5s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{}}
    load_assignment:
      cluster_name: epp_log_{index}
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: 127.0.0.1, port_value: {port} }}
"""


def _block(start: str, end: str) -> str:
    """The lines of envoy.yaml from the one starting `start` up to the one starting `end`."""
    text = (HERE / "envoy.yaml").read_text()
    i = text.index(start)
    return text[i : text.index(end, i)]


_ACCESS_LOG = _block(
    "          # The response path (`epp serve --response-path log`", "          route_config:"
)
_LUA_FILTER = _block(
    "          # Reads the response as it streams past",
    "          - name: envoy.filters.http.router",
)
_SKIPPED_RESPONSE = _block(
    "                # The response does not pass through the EPP", "              # Generous:"
)

_REPLICA_EDITS += [
    (
        _LOGGER,
        _logger_for(0)
        + _block("                buffer_size_bytes:", "          route_config:")
        + _block(
            "          - name: envoy.access_loggers.http_grpc", "                grpc_service:"
        )
        + _logger_for(1),
    ),
]
_REPLICA_TAIL = _log_cluster(0, 9002) + _log_cluster(1, 9012)

_INPATH_EDITS = [
    (_ACCESS_LOG, ""),
    (_LUA_FILTER, ""),
    (
        _SKIPPED_RESPONSE,
        """                # The response path through the EPP (epp serve --response-path on): every
                # response chunk goes to the EPP, which returns it unchanged at once (Envoy
                # forwards only what the processor sends back in FULL_DUPLEX_STREAMED), so
                # a stream reaches the client chunk by chunk. Cost: one gRPC message each
                # way per response chunk (docs/observability.md, "Response paths").
                response_header_mode: SEND
                response_body_mode: FULL_DUPLEX_STREAMED
                response_trailer_mode: SEND
""",
    ),
]

_EXT_PROC_TYPE = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"

_OBSERVER_EDITS = [
    (_ACCESS_LOG, ""),
    (_LUA_FILTER, ""),
    (
        _SKIPPED_RESPONSE,
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


def _edit(name: str, note: str, edits: list[tuple[str, str]], tail: str = "") -> str:
    text = (HERE / "envoy.yaml").read_text()
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"deploy/envoy/envoy.yaml changed: cannot find {old.strip()!r}")
        text = text.replace(old, new)
    return f"# Generated by deploy/envoy/render.py from envoy.yaml: {note}\n" + text + tail


def tls_config() -> str:
    return _edit("tls", "the EPP serves TLS (see the ext_proc cluster).", _TLS_EDITS)


def replicas_config() -> str:
    note = "two EPPs in the ext_proc cluster, an access log to each."
    return _edit("replicas", note, _REPLICA_EDITS, _REPLICA_TAIL)


def inpath_config() -> str:
    note = "the response through the EPP, chunk by chunk (--response-path on)."
    return _edit("inpath", note, _INPATH_EDITS)


def observer_config() -> str:
    note = "the response on an observability-mode ext_proc filter."
    return _edit("observer", note, _OBSERVER_EDITS)


def outputs() -> dict[Path, str]:
    return {
        HERE / "envoy-tls.yaml": tls_config(),
        HERE / "envoy-replicas.yaml": replicas_config(),
        HERE / "envoy-inpath.yaml": inpath_config(),
        HERE / "envoy-observer.yaml": observer_config(),
    }


if __name__ == "__main__":
    for path, text in outputs().items():
        path.write_text(text)
