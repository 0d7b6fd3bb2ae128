"""Prefill/decode disaggregation: the `kv_transfer_params` protocol of vLLM's NIXL
connector, as the llm-d routing sidecar drives it (../shared/reference/llm-d.md §1.4).

- Prefill leg: the request carries `{"do_remote_decode": true, ...}`. The prefill
  server computes the prompt, answers with one token and returns the parameters the
  decoder needs: `do_remote_prefill: true`, `do_remote_decode: false`, the
  `remote_engine_id`, the `remote_block_ids` holding the prompt's KV, `remote_host`,
  `remote_port` and `tp_size`.
- Decode leg: the request carries those parameters back. The decode server takes its
  own prefix-cache hit, pulls the rest of the prompt's KV (`kv_transfer_ms_per_token`
  per token) instead of computing it, then decodes.

`--kv-role` says which legs a server honours: `both` (vLLM's `kv_both`, the default),
`prefill`, `decode`, or `none` (no connector: the parameters are ignored, as vLLM does
without `--kv-transfer-config`). Whatever the role, each request's kind of parameters
is counted for `GET /admin`.
"""

from __future__ import annotations

from typing import Any, Literal

Kind = Literal["none", "do_remote_decode", "do_remote_prefill", "other"]


def classify(params: Any) -> Kind:
    """Which leg a request's `kv_transfer_params` ask for (validated as an object)."""
    if params is None:
        return "none"
    if not isinstance(params, dict):
        raise ValueError("'kv_transfer_params' must be an object")
    if params.get("do_remote_decode") is True:
        return "do_remote_decode"
    if params.get("do_remote_prefill") is True:
        return "do_remote_prefill"
    return "other"


def honours(kv_role: str, kind: Kind) -> bool:
    if kind == "do_remote_decode":
        return kv_role in ("both", "prefill")
    if kind == "do_remote_prefill":
        return kv_role in ("both", "decode")
    return False


def prefill_answer(
    engine_id: str, block_ids: list[int], host: str, port: int, tp_size: int = 1
) -> dict[str, Any]:
    """The `kv_transfer_params` a prefill server returns (vLLM NixlConnector's shape)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": block_ids,
        "remote_engine_id": engine_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": tp_size,
    }
