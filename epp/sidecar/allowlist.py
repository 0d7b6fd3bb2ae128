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

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from epp.datalayer.endpoints_file import EndpointsError, load_endpoints_file

log = logging.getLogger("epp.sidecar")

_RECHECK_S = 1.0


def parse_hostport(value: str) -> tuple[str, int | None] | None:
    """`10.0.0.5:8000`, `[fd00::1]:8000`, `host` → (host, port or None); None if malformed."""
    value = value.strip()
    if not value or "/" in value or any(c.isspace() for c in value):
        return None
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not host:
            return None
        if not rest:
            return host.lower(), None
        if not rest.startswith(":"):
            return None
        port_text = rest[1:]
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
    elif ":" in value:  # a bare IPv6 literal
        return value.lower(), None
    else:
        return value.lower(), None
    if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        return None
    return host.lower(), int(port_text)


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
        parsed = parse_hostport(hostport)
        if parsed is None or parsed[1] is None:
            return False
        self._maybe_reload()
        host = parsed[0]
        entries = self._static | self._from_file
        return parsed in entries or (host, None) in entries

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
        if now - self._checked_at < _RECHECK_S:
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
    return {(e.address.lower(), e.port) for e in load_endpoints_file(path)}


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
