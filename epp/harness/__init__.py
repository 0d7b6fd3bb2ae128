"""The local-stack harness: everything that starts real processes around the EPP for
the demo, the end-to-end tests and the benchmarks (simulators, Envoy, `epp serve`).

Nothing on the request path imports this package: `epp serve` runs without it.
"""
