"""A loopback TCP proxy whose connections can be reset at will (tests only).

Put between Envoy and the EPP's ext_proc port, `reset()` aborts every connection both
ways with an RST (SO_LINGER 0), which is what a network fault or a middlebox dropping the
HTTP/2 connection does to every gRPC stream on it.
"""

from __future__ import annotations

import asyncio
import socket
import struct


class ResettableProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self.resets = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def start(self) -> ResettableProxy:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.reset()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def reset(self) -> int:
        """RST every open connection; returns how many were open."""
        pairs = list(self._pairs)
        self._pairs.clear()
        for pair in pairs:
            for w in pair:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                w.transport.abort()
        self.resets += len(pairs)
        return len(pairs)

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            cw.transport.abort()
            return
        self.connections += 1
        pair = (cw, uw)
        self._pairs.add(pair)
        await asyncio.gather(self._pipe(cr, uw), self._pipe(ur, cw))
        self._pairs.discard(pair)
        for w in pair:
            w.transport.abort()

    @staticmethod
    async def _pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not w.transport.is_closing():
                w.transport.abort()
