"""epp: an endpoint picker for LLM inference, served as an Envoy ext_proc gRPC server."""

__version__ = "0.1.0"
