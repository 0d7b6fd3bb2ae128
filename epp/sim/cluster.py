"""Several simulators in one event loop: the pool an EPP routes across, in tests and
in `epp sim --replicas N`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from epp.sim.config import SimConfig
from epp.sim.server import SimServer


class SimCluster:
    """`n` independent servers named `{name_prefix}-{i}`.

    `base_port=0` gives every replica its own free port (read `.port`/`.url` after
    start); otherwise replica i listens on `base_port + i`. `configs`, if given, sets
    each replica's config (a heterogeneous pool) and overrides `n` and `config`.

    With KV events, replica i publishes on topic `kv@host:port_i@model` (or the
    configured topic template); a bound endpoint `tcp://*:P` becomes `tcp://*:P+i`, a
    connected one is shared (the subscriber binds it once and tells replicas by topic).
    """

    def __init__(
        self,
        n: int = 1,
        config: SimConfig | None = None,
        *,
        host: str = "127.0.0.1",
        base_port: int = 0,
        name_prefix: str = "sim",
        configs: Sequence[SimConfig] | None = None,
    ) -> None:
        if configs is None:
            if n < 1:
                raise ValueError("a cluster needs at least one replica")
            configs = [config or SimConfig()] * n
        self.servers = [
            SimServer(
                f"{name_prefix}-{i}",
                cfg,
                host=host,
                port=base_port + i if base_port else 0,
                replica=i,
            )
            for i, cfg in enumerate(configs)
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self.servers]

    def by_name(self, name: str) -> SimServer:
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(name)

    async def start(self) -> None:
        started: list[SimServer] = []
        try:
            for server in self.servers:
                await server.start()
                started.append(server)
        except BaseException:
            for server in started:  # a taken port must not leak the others
                await server.stop()
            raise

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __getitem__(self, i: int) -> SimServer:
        return self.servers[i]

    def __iter__(self) -> Iterator[SimServer]:
        return iter(self.servers)

    def __len__(self) -> int:
        return len(self.servers)
