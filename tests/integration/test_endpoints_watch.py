"""`epp serve --endpoints FILE` follows changes to the file; flag endpoints stay."""

import asyncio

from epp.datastore import Endpoint
from epp.serve import EppServer, ServeOptions
from tests.eventually import eventually


async def test_pool_follows_the_endpoints_file(tmp_path):
    f = tmp_path / "pool.yaml"
    f.write_text("- {name: a, address: 10.0.0.1, port: 8000}\n")
    flag = Endpoint("flag", "10.0.0.9", 8000)
    opts = ServeOptions(
        host="127.0.0.1",
        grpc_port=0,
        health_port=0,
        metrics_port=0,
        scrape=False,
        endpoints=[Endpoint("a", "10.0.0.1", 8000), flag],
        watch_file=str(f),
        extra_endpoints=[flag],
    )
    async with EppServer(opts) as server:
        names = lambda: sorted(e.name for e in server.datastore.endpoints())  # noqa: E731
        assert names() == ["a", "flag"]
        f.write_text(
            "- {name: a, address: 10.0.0.1, port: 8000}\n"
            "- {name: b, address: 10.0.0.2, port: 8000}\n"
        )
        await eventually(lambda: names() == ["a", "b", "flag"])
        f.write_text("- {name: b, address: 10.0.0.2, port: 8000, bogus: 1}\n")  # invalid
        await asyncio.sleep(1.5)
        assert names() == ["a", "b", "flag"]  # a bad file keeps the current pool
        f.write_text("- {name: b, address: 10.0.0.2, port: 8000}\n")
        await eventually(lambda: names() == ["b", "flag"])
