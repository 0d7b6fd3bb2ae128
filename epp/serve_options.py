"""`ServeOptions`: everything `epp serve` was told, validated, as one value.

`epp.serve_args` builds it from the command line; tests build it directly; `EppServer`
(epp/serve.py) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from epp.admission import Objectives
from epp.datalayer.k8s_discovery import KubeSource
from epp.datastore import Endpoint
from epp.election import cli as election_cli
from epp.extproc.access_log import RESPONSE_LOG_TIMEOUT
from epp.extproc.server import StreamLimits
from epp.extproc.tls import ServerCert
from epp.rewrite import Rewrite

if TYPE_CHECKING:
    from epp.planner.core.config import PlannerConfig
    from epp.planner.core.perf import Profile

DEFAULT_MAX_SCRAPE_INTERVAL = 1.0  # adaptive scraping's ceiling unless a flag says otherwise


@dataclass
class ServeOptions:
    host: str = "0.0.0.0"
    grpc_port: int = 9002
    health_port: int = 9003
    metrics_port: int = 9090
    limits: StreamLimits = field(default_factory=StreamLimits)
    # On SIGTERM: health NOT_SERVING, new streams refused, open ones get this long.
    drain_timeout: float = 30.0
    # Upstream's 50 ms while an endpoint's metrics change, backing off to 1 s while they
    # do not (epp/datalayer/scraper.py): an idle pool costs what a fixed 1 s does (-65 %
    # of the servers' scrape CPU, docs/BENCHMARKS.md@a73a134 "Scrape interval"), while a server
    # under changing load is still read every 50 ms, which the configs that score
    # scraped queues (load-only, prefix-weighted, precise) need. The default config
    # (sticky until saturated) takes its fast signal from the EPP's own in-flight counts.
    # 0 = upstream's fixed interval (`--refresh-metrics-max-interval 0`).
    refresh_metrics_interval: float = 0.05
    refresh_metrics_max_interval: float = DEFAULT_MAX_SCRAPE_INTERVAL
    metrics_staleness_threshold: float = 2.0
    scrape_timeout: float = 1.0
    pool_name: str = "default"
    # The pods' namespace (the `namespace` label of scheduling attempts): the pool's with
    # Kubernetes discovery, else $NAMESPACE, else "default" (GIE's --pool-namespace rule).
    namespace: str = "default"
    scrape: bool = True
    endpoints: list[Endpoint] = field(default_factory=list)
    # Re-read this endpoints file when it changes (e.g. a Kubernetes ConfigMap);
    # `extra_endpoints` (from --endpoint flags) stay beside it.
    watch_file: str | None = None
    extra_endpoints: list[Endpoint] = field(default_factory=list)
    # Kubernetes discovery (--pool-name / --endpoint-selector): it owns the pool.
    kubernetes: KubeSource | None = None
    # Measure responses (TTFT, ITL, usage; in-flight until the response ends). Needs
    # Envoy's response phases (deploy/envoy/envoy.yaml ships them on).
    response_path: bool = True
    # `--response-path observer`: the response comes on Envoy's second, observability-mode
    # ext_proc stream (deploy/envoy/envoy-observer.yaml), off the client's path.
    response_observer: bool = False
    # `--tracing`: OpenTelemetry spans per request stage (epp/tracing.py).
    tracing: bool = False
    # `--response-path log` (the default): the response is measured inside Envoy and
    # reported in its access log (epp/extproc/access_log.py); a request whose entries stop
    # for `response_log_timeout` seconds is given back unmeasured. False with
    # response_path True is `--response-path on`; response_observer wins over it.
    response_log: bool = True
    response_log_timeout: float = RESPONSE_LOG_TIMEOUT
    # `--planner FILE`: the parsed planner file and its profile (sla/dynamo modes).
    planner: PlannerConfig | None = None
    planner_profile: Profile | None = None
    # Objective name → priority (--objectives); priority < 0 is shed (429) when saturated.
    objectives: Objectives = field(default_factory=Objectives)
    # InferenceModelRewrites (--model-rewrites; with --pool-name, the cluster's join them).
    rewrites: list[Rewrite] = field(default_factory=list)
    # Several EPPs with --planner: only the elected one's planner acts (None: always acts).
    election: election_cli.ElectionSpec | None = None
    # TLS on the ext_proc port (--secure-serving / --cert-path); None: plaintext.
    tls: ServerCert | None = None
