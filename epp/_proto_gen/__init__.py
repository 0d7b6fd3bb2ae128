"""Code generated from proto/*.proto by `make proto` (grpcio-tools); do not edit."""
