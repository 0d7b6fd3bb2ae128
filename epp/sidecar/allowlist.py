"""Which prefill servers a request may name in `x-prefiller-host-port`.

The header decides where the sidecar sends the whole prompt, so a value from anywhere
but the EPP must not reach arbitrary hosts (llm-d guards this with
`--enable-ssrf-protection` against the InferencePool's pods). The EPP removes client
copies, but the sidecar's port may be reachable without the gateway, so it checks too.

Entries are `HOST:PORT` (that port only) or a bare `HOST` (any port), from `--allow`,
and the endpoints of an endpoints file (the same YAML `epp serve --endpoints` reads),
re-read when the file changes so a ConfigMap update needs no restart. A bad edit keeps
the previous list (logged). An empty allowlist refuses every prefill header.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from epp.datalayer.endpoints_file import EndpointsError, load_endpoints_file

log = logging.getLogger("epp.sidecar")

# how often (at most) the allowlist file is stat-ed for changes; the planner's local
# connector waits this long before routing to a prefill replica it just listed
ALLOWLIST_RECHECK_S = 1.0


_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
# Labels inet_aton(3) reads as numbers (getaddrinfo accepts `167772165`, `0x0a.0.0.5`,
# `010.0.0.5`): a host whose last label looks like one is an IP form or nothing.
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)")


def canonical_host(host: str) -> str | None:
    """One spelling per host, or None if it is not a plain IP literal or DNS name.

    IPv6 is compressed and an IPv4-mapped IPv6 address becomes its IPv4 address (the
    same host either way); IPv4 must be four decimal octets without leading zeros;
    DNS names are lower-case ASCII letters, digits, dots and hyphens, one trailing dot
    dropped. Everything else (userinfo `a@b`, zone ids `%eth0`, percent-encoding,
    decimal/hex/octal IPv4, non-ASCII look-alikes, whitespace) is refused: the sidecar
    never hands a resolver a string it might read differently from this check.
    """
    if not host or not host.isascii():
        return None
    host = host.lower()
    if ":" in host:
        try:
            ip6 = ipaddress.IPv6Address(host)
        except ValueError:
            return None
        if ip6.scope_id:
            return None
        return str(ip6.ipv4_mapped) if ip6.ipv4_mapped else ip6.compressed
    if host.endswith("."):
        host = host[:-1]
    if not _NAME.fullmatch(host) or len(host) > 253:
        return None
    if _NUMERIC_LABEL.fullmatch(host.rsplit(".", 1)[-1]):
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError:
            return None
    return host


def parse_hostport(value: str) -> tuple[str, int | None] | None:
    """`10.0.0.5:8000`, `[fd00::1]:8000`, `host` → (canonical host, port or None);
    None if malformed or not a plain host (see `canonical_host`)."""
    value = value.strip()
    if not value or not value.isascii():
        return None
    port_text: str | None = None
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
        if ":" not in host:  # brackets are for IPv6 only
            return None
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
    else:  # a bare host, or a bare IPv6 literal
        host = value
    canonical = canonical_host(host)
    if canonical is None:
        return None
    if port_text is None:
        return canonical, None
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        return None
    return canonical, int(port_text)


def format_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Allowlist:
    def __init__(
        self,
        entries: Iterable[str] = (),
        endpoints_file: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._static: set[tuple[str, int | None]] = set()
        for entry in entries:
            parsed = parse_hostport(entry)
            if parsed is None:
                raise ValueError(f"--allow {entry!r}: expected HOST:PORT or HOST")
            self._static.add(parsed)
        self._file = Path(endpoints_file) if endpoints_file else None
        self._from_file: set[tuple[str, int | None]] = set()
        self._stat: tuple[int, int, int] | None = None
        self._clock = clock
        self._checked_at = 0.0
        if self._file is not None:
            self._from_file = _load(self._file)  # a bad file at start-up is fatal
            self._stat = _stat(self._file)
            self._checked_at = clock()

    def allows(self, hostport: str) -> bool:
        return self.resolve(hostport) is not None

    def resolve(self, hostport: str) -> str | None:
        """The canonical `host:port` to connect to if `hostport` is allowed, else None.

        Callers connect to this, never to the raw header value, so what was checked is
        exactly what is dialled.
        """
        parsed = parse_hostport(hostport)
        if parsed is None or parsed[1] is None:
            return None
        self._maybe_reload()
        host, port = parsed
        entries = self._static | self._from_file
        if parsed in entries or (host, None) in entries:
            return format_hostport(host, port)
        return None

    def __len__(self) -> int:
        return len(self._static | self._from_file)

    def describe(self) -> str:
        def fmt(e: tuple[str, int | None]) -> str:
            host = f"[{e[0]}]" if ":" in e[0] else e[0]
            return host if e[1] is None else f"{host}:{e[1]}"

        return ", ".join(sorted(fmt(e) for e in self._static | self._from_file)) or "empty"

    def _maybe_reload(self) -> None:
        if self._file is None:
            return
        now = self._clock()
        if now - self._checked_at < ALLOWLIST_RECHECK_S:
            return
        self._checked_at = now
        stat = _stat(self._file)
        if stat == self._stat:
            return
        self._stat = stat
        try:
            self._from_file = _load(self._file)
            log.info("allowlist reloaded from %s: %d entries", self._file, len(self._from_file))
        except EndpointsError as e:
            log.error(
                "allowlist file not reloaded, keeping %d entries: %s", len(self._from_file), e
            )


def _load(path: Path) -> set[tuple[str, int | None]]:
    out = set()
    for e in load_endpoints_file(path):
        host = canonical_host(e.address)
        if host is None:
            raise EndpointsError(
                f"{path}: endpoint {e.name!r}: address {e.address!r} is not a plain IP or DNS name"
            )
        out.add((host, e.port))
    return out


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
