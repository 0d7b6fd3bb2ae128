"""The local connector's statefile: which replicas this EPP started, so a restarted
EPP adopts them instead of orphaning or duplicating them.

Dynamo's local connector (LOAD-v0, reference §6.3) kept
`~/.dynamo/state/{namespace}.json` with each worker's command and resources. Here one
JSON object: `{"version": 1, "workers": [{name, role, port, pid, argv, log}]}`; a decode
replica with its P/D sidecar also has `server_port` (the decode server's own port; `port`
is the sidecar's, the one the pool lists), `sidecar_pid` and `sidecar_argv` (files
without them read as replicas without a sidecar). `draining` is true once the leader
started draining the replica: followers mirror it, so no EPP routes new requests to a
replica that is about to stop (files without it read as not draining).
A worker is adopted only if its pid is alive *and* runs the recorded argv (a reused pid
runs something else), its sidecar likewise, *and* it answers its health check; the
connector checks that.

Pure: `encode`/`decode` only; the connector writes the text atomically
(temporary file + rename), so a crash mid-write leaves the old state.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from epp.config.errors import ConfigError
from epp.planner.core.types import Role

VERSION = 1


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    name: str
    role: Role
    port: int
    pid: int
    argv: tuple[str, ...]
    log: str = ""
    server_port: int = 0  # the model server's own port when a sidecar fronts it; else 0
    sidecar_pid: int = 0  # 0: no sidecar
    sidecar_argv: tuple[str, ...] = ()
    draining: bool = False  # the leader is draining it: out of every EPP's scheduling


def encode(workers: Sequence[WorkerRecord]) -> str:
    rows = [
        {**asdict(w), "role": w.role.value, "argv": list(w.argv),
         "sidecar_argv": list(w.sidecar_argv)}
        for w in workers
    ]  # fmt: skip
    return json.dumps({"version": VERSION, "workers": rows}, indent=2) + "\n"


def decode(text: str, source: str = "statefile") -> list[WorkerRecord]:
    """The workers recorded in `text`; a damaged file is a ConfigError naming it (the
    connector then starts afresh rather than guess)."""
    try:
        raw = json.loads(text)
        if raw.get("version") != VERSION:
            raise ValueError(f"version {raw.get('version')!r}, expected {VERSION}")
        return [
            WorkerRecord(
                name=str(w["name"]),
                role=Role(w["role"]),
                port=int(w["port"]),
                pid=int(w["pid"]),
                argv=tuple(str(a) for a in w["argv"]),
                log=str(w.get("log", "")),
                server_port=int(w.get("server_port", 0)),
                sidecar_pid=int(w.get("sidecar_pid", 0)),
                sidecar_argv=tuple(str(a) for a in w.get("sidecar_argv", ())),
                draining=w.get("draining", False) is True,
            )
            for w in raw["workers"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(
            "", f"unreadable statefile ({e}); delete it to start afresh", source
        ) from None
