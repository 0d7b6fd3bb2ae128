"""Every way a client could make the P/D sidecar call a host it should not (issue 13 §5):
each spelling is refused by the allowlist, and end to end no byte reaches the target."""

import asyncio
import json

import pytest

from epp.headers import PREFILLER_HOST_PORT as PD
from epp.sidecar.allowlist import Allowlist, canonical_host, parse_hostport
from epp.sim import SimServer
from tests.unit.test_sidecar import FAST, LONG_PROMPT, post, sidecar_for

ALLOWED = ["10.0.0.5:8000", "[fd00::1]:8000", "prefill-0.pool.svc:8000"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("user@10.0.0.5:8000", "userinfo"),
        ("10.0.0.5:8000@evil.example:80", "userinfo after the port"),
        ("evil.example#@10.0.0.5:8000", "fragment trick"),
        ("10.0.0.5%3a8000", "percent-encoded colon"),
        ("10.0.0.5:8000/../x", "a path"),
        ("10.0.0.5:8000?x=1", "a query"),
        ("167772165:8000", "decimal IPv4 (10.0.0.5)"),
        ("0x0a000005:8000", "hex IPv4"),
        ("0x0a.0.0.5:8000", "hex octet"),
        ("010.0.0.5:8000", "octal octet"),
        ("10.5:8000", "short IPv4 form"),
        ("10.0.0.5:08000x", "junk port"),
        ("10.0.0.5:٨٠٠٠", "Arabic-Indic digits in the port"),
        ("10.0.0.5:0", "port 0"),
        ("10.0.0.5:65536", "port out of range"),
        ("[fd00::1%eth0]:8000", "IPv6 zone id"),
        ("[10.0.0.5]:8000", "IPv4 in IPv6 brackets"),
        ("fd00::1:8000", "unbracketed IPv6 with a port"),
        ("ｐrefill-0.pool.svc:8000", "full-width look-alike letter"),
        ("prefill-0.pool.svc.evil.example:8000", "allowed name as a prefix"),
        ("evil.example:8000", "DNS name not listed"),
        ("10.0.0.5", "no port"),
        ("10.0.0.5:8001", "another port of an allowed host"),
        ("10.0.0.5 :8000", "whitespace"),
        ("", "empty"),
    ],
)
def test_each_ssrf_spelling_is_refused(value, reason):
    assert Allowlist(ALLOWED).resolve(value) is None, reason


@pytest.mark.parametrize(
    ("value", "dialled"),
    [
        ("10.0.0.5:8000", "10.0.0.5:8000"),
        ("[::ffff:10.0.0.5]:8000", "10.0.0.5:8000"),  # IPv4-mapped: the same host
        ("[FD00:0:0::1]:8000", "[fd00::1]:8000"),  # one canonical IPv6 spelling
        ("PREFILL-0.pool.svc.:8000", "prefill-0.pool.svc:8000"),  # case, trailing dot
    ],
)
def test_equivalent_spellings_of_an_allowed_host_dial_its_canonical_form(value, dialled):
    assert Allowlist(ALLOWED).resolve(value) == dialled


def test_canonical_host_refuses_what_a_resolver_might_read_differently():
    assert canonical_host("10.0.0.5") == "10.0.0.5"
    assert canonical_host("0177.0.0.1") is None  # octal 127.0.0.1 for inet_aton
    assert canonical_host("2130706433") is None  # decimal 127.0.0.1
    assert canonical_host("a" * 64 + ".svc") == "a" * 64 + ".svc"
    assert canonical_host("-bad.svc") is None
    assert parse_hostport("[fd00::1]") == ("fd00::1", None)


def test_an_allowlist_entry_that_is_not_a_plain_host_is_refused_at_start_up():
    with pytest.raises(ValueError):
        Allowlist(["user@10.0.0.5:8000"])


async def test_no_spelling_reaches_an_unlisted_server_on_the_same_machine():
    """A real listener on 127.0.0.1 counts connections; the allowlist names only the
    prefill server's port. Every spelling aimed at the listener gets 403, and the
    listener sees not one connection."""
    connections = 0

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    target = await asyncio.start_server(count, "127.0.0.1", 0)
    port = target.sockets[0].getsockname()[1]
    spellings = [
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f"127.1:{port}",
        f"2130706433:{port}",
        f"0x7f000001:{port}",
        f"[::ffff:127.0.0.1]:{port}",
        f"[::1]:{port}",
        f"user@127.0.0.1:{port}",
    ]
    try:
        async with (
            SimServer("pre-0", FAST) as pre,
            SimServer("dec-0", FAST) as dec,
            sidecar_for(dec.url, f"127.0.0.1:{pre.port}") as sc,
        ):
            body = {"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 2}
            for value in spellings:
                status, _, raw = await post(sc.url, body, {PD: value})
                assert status == 403, value
                assert json.loads(raw)["error"]["code"] == "prefiller_not_allowed"
            assert pre.stats.requests_received == 0
            assert dec.stats.requests_received == 0
    finally:
        target.close()
        await target.wait_closed()
    assert connections == 0
