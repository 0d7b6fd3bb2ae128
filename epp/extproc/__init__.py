"""The Envoy ext_proc side: protobuf messages in, routing decisions out."""
