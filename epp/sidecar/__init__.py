"""`epp sidecar`: the decode-side half of prefill/decode disaggregation.

It runs beside a decode server (as llm-d's `pd-sidecar` does) and is what the pool lists
as the decode endpoint. A request without `x-prefiller-host-port` passes through
unchanged. With it, the sidecar first has the named prefill server compute the prompt's
KV cache (`max_tokens` 1, `kv_transfer_params.do_remote_decode`), then asks the local
decode server to continue from the transferred KV (the prefill's `kv_transfer_params`).

    protocol.py   request/response rewriting (pure functions, no I/O)
    allowlist.py  which prefill servers may be named
    metrics.py    the sidecar's own Prometheus metrics
    proxy.py      the aiohttp proxy (`Sidecar`)
    cli.py        `epp sidecar` flags
"""

from epp.sidecar.proxy import Sidecar, SidecarOptions

__all__ = ["Sidecar", "SidecarOptions"]
