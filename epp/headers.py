"""Names on the wire that the gateway, the EPP, the sidecar and the simulator agree on.

Defined once here and imported everywhere, so a rename cannot leave one side behind.
Sources: GIE `pkg/epp/metadata/consts.go` (destination endpoint, subset hint, objective,
fairness id, model rewrite), llm-d `pkg/common` (prefiller host:port), llm-d's
session-affinity scorer (session token).
"""

from __future__ import annotations

# Request headers the EPP reads.
REQUEST_ID = "x-request-id"
OBJECTIVE = "x-gateway-inference-objective"
FAIRNESS_ID = "x-gateway-inference-fairness-id"
MODEL_REWRITE = "x-gateway-model-name-rewrite"
SESSION_TOKEN = "x-session-token"  # session-affinity-scorer's default `headerName`
# Per-request latency objectives in milliseconds (GIE latency-predictor plugins).
SLO_TTFT_MS = "x-slo-ttft-ms"
SLO_TPOT_MS = "x-slo-tpot-ms"
# How long this request may wait in the flow-control queue, a Go duration ("2s", "500ms"):
# llm-d-router `pkg/epp/metadata/consts.go` InferenceTTLHeaderKey (bounded here by the
# configured defaultRequestTTL).
INFERENCE_TTL = "x-llm-d-inference-ttl"

# Headers (and dynamic-metadata keys) the EPP sets for Envoy and the model servers.
DESTINATION_ENDPOINT = "x-gateway-destination-endpoint"
PREFILLER_HOST_PORT = "x-prefiller-host-port"  # read by the decode-side sidecar
# The encode endpoints (comma-separated ip:port) the decode-side sidecar sends a
# multimodal request's media to first: llm-d-router `pkg/common/routing/common.go`.
ENCODER_HOSTS_PORTS = "x-encoder-hosts-ports"
# The data-parallel rank a multi-rank vLLM server should run the request on: vLLM's API
# server reads `X-data-parallel-rank` (`OpenAIServing._get_data_parallel_rank`, an int;
# anything else is ignored) and its DP client then skips its own load balancing.
DATA_PARALLEL_RANK = "x-data-parallel-rank"
# Set on the upstream request in `--response-path observer` mode: the observer ext_proc
# stream reads it to join the request's in-flight record (epp/extproc/handoff.py).
ROUTE_ID = "x-epp-route-id"

# Envoy dynamic metadata: where the EPP writes its pick, where the gateway's subset hint is.
LB_METADATA_NAMESPACE = "envoy.lb"
SUBSET_HINT_NAMESPACE = "envoy.lb.subset_hint"
DESTINATION_SUBSET = "x-gateway-destination-endpoint-subset"

# On every 429/503 the EPP answers (and on an evicted request's reset): why, in
# llm-d-router's vocabulary (`pkg/common/error/error.go` RequestDroppedReasonHeaderKey;
# the values are epp/errors.py's).
DROPPED_REASON = "x-llm-d-request-dropped-reason"

# Response header naming the simulator replica that answered (`epp sim`).
SIM_SERVER = "x-sim-server"
# Response header naming the data-parallel rank that ran the request (`epp sim
# --data-parallel-size N`, N > 1).
SIM_DP_RANK = "x-sim-dp-rank"
# The simulator echoes the traceparent it received (epp/sim/server.py).
SIM_TRACEPARENT = "x-sim-traceparent"
