"""Static endpoint discovery: a YAML file, or `--endpoint name=host:port;label=value` flags.

Outside Kubernetes the pool is a list someone typed, so mistakes are likely and must
be caught at start-up with a message that says where (file, entry index, field) and
how to fix it, rather than surfacing later as an endpoint that never gets traffic.
`watch_endpoints_file` lets the list change without a restart; a bad edit keeps the
previous pool (logged), so a typo cannot empty a live pool.

File shape (either form)::

    - name: sim-0
      address: 127.0.0.1
      port: 8000
      labels: {llm-d.ai/role: decode}

    endpoints:
    - {name: sim-1, address: 127.0.0.1, port: 8001}
"""

from __future__ import annotations

import asyncio
import difflib
import ipaddress
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from epp.datastore import Datastore, Endpoint

__all__ = [
    "EndpointsError",
    "load_endpoints_file",
    "parse_endpoint_arg",
    "parse_endpoint_args",
    "parse_endpoints",
    "watch_endpoints_file",
]

log = logging.getLogger(__name__)

_ENTRY_KEYS = ("name", "address", "port", "labels")
_TOP_KEYS = ("endpoints",)


class EndpointsError(ValueError):
    """A bad endpoint list; the text names the source, the entry, the field and the fix."""

    def __init__(self, message: str, source: str = "", where: str = "") -> None:
        self.message = message
        self.source = source
        self.where = where
        prefix = "".join(f"{p}: " for p in (source, where) if p)
        super().__init__(prefix + message)


def _did_you_mean(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}allowed keys: {', '.join(known)}"


def _check_address(address: str, err: Any) -> str:
    """A bare host name or IP; brackets around an IPv6 literal are dropped."""
    address = address.strip()
    if not address:
        raise err("address", "must be a non-empty host name or IP address")
    if "://" in address:
        raise err("address", f"{address!r} is a URL; give only the host, e.g. '10.0.0.5'")
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    if ":" in address:
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise err(
                "address",
                f"{address!r} looks like host:port; put the port in the 'port' field",
            ) from None
    if any(c.isspace() for c in address) or "/" in address:
        raise err("address", f"{address!r} is not a host name or IP address")
    return address


def _check_port(port: object, err: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise err(
            "port",
            f"must be an integer in 1..65535, got {port!r} ({type(port).__name__});"
            " write it unquoted, e.g. port: 8000",
        )
    if not 1 <= port <= 65535:
        raise err("port", f"must be in 1..65535, got {port}")
    return port


def _check_name(name: object, err: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise err("name", f"must be a non-empty string, got {name!r}")
    name = name.strip()
    if any(c.isspace() for c in name):
        raise err("name", f"{name!r} contains whitespace; use e.g. 'sim-0'")
    return name


def _check_labels(labels: object, err: Any) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise err("labels", f"must be a mapping of label: value, got {type(labels).__name__}")
    out: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not key.strip():
            raise err("labels", f"label name {key!r} must be a non-empty string")
        if not isinstance(value, str):
            raise err(
                f"labels.{key}",
                f'must be a string, got {value!r}; quote it, e.g. {key}: "{value}"',
            )
        out[key.strip()] = value
    return out


def parse_endpoints(data: object, source: str = "<endpoints>") -> list[Endpoint]:
    """Validate already-loaded YAML data (a list, or a mapping with `endpoints:`)."""
    if data is None:
        return []
    if isinstance(data, dict):
        for key in data:
            if key not in _TOP_KEYS:
                raise EndpointsError(
                    f"unknown top-level key {key!r}; {_did_you_mean(str(key), _TOP_KEYS)}",
                    source,
                )
        data = data.get("endpoints")
        if data is None:
            return []
    prefix = "endpoints"
    if not isinstance(data, list):
        raise EndpointsError(
            f"expected a list of endpoints, got {type(data).__name__};"
            " write '- {name: ..., address: ..., port: ...}' entries",
            source,
            prefix,
        )
    endpoints: list[Endpoint] = []
    names: dict[str, int] = {}
    hostports: dict[str, int] = {}
    for index, entry in enumerate(data):
        at = f"{prefix}[{index}]"

        def err(fld: str, msg: str, _at: str = at) -> EndpointsError:
            return EndpointsError(msg, source, f"{_at}.{fld}")

        if not isinstance(entry, dict):
            raise EndpointsError(
                f"each endpoint must be a mapping with name, address, port; got {entry!r}",
                source,
                at,
            )
        for key in entry:
            if key not in _ENTRY_KEYS:
                raise err(str(key), f"unknown key; {_did_you_mean(str(key), _ENTRY_KEYS)}")
        for required in ("name", "address", "port"):
            if required not in entry:
                raise err(required, "is required")
        name = _check_name(entry["name"], err)
        if not isinstance(entry["address"], str):
            raise err("address", f"must be a string, got {entry['address']!r}")
        address = _check_address(entry["address"], err)
        port = _check_port(entry["port"], err)
        labels = _check_labels(entry.get("labels"), err)
        ep = Endpoint(name=name, address=address, port=port, labels=labels)
        if name in names:
            raise err("name", f"duplicate name {name!r} (first used at entry {names[name]})")
        if ep.hostport in hostports:
            raise err(
                "port",
                f"{ep.hostport} is already endpoint entry {hostports[ep.hostport]};"
                " each endpoint needs its own address:port",
            )
        names[name] = index
        hostports[ep.hostport] = index
        endpoints.append(ep)
    return endpoints


def load_endpoints_file(path: str | os.PathLike[str]) -> list[Endpoint]:
    """Read and validate an endpoints YAML file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise EndpointsError(f"cannot read the file: {e.strerror or e}", source) from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise EndpointsError(f"not valid YAML: {e}", source) from e
    return parse_endpoints(data, source)


def parse_endpoint_arg(text: str, source: str = "--endpoint") -> Endpoint:
    """`name=host:port[;label=value...]` → Endpoint (IPv6 as `[::1]:8000`)."""
    where = repr(text)

    def err(fld: str, msg: str) -> EndpointsError:
        return EndpointsError(
            f"{fld}: {msg} (expected name=host:port[;label=value...])", source, where
        )

    head, *label_parts = text.split(";")
    name, eq, hostport = head.partition("=")
    if not eq:
        raise err("name", "missing '=' between the name and host:port")
    name = _check_name(name, err)
    hostport = hostport.strip()
    host, colon, port_text = hostport.rpartition(":")
    if not colon or not host:
        raise err("port", f"{hostport!r} has no ':port'")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise err("address", f"write an IPv6 address in brackets, e.g. [{host}]:{port_text}")
    address = _check_address(host, err)
    try:
        port: object = int(port_text)
    except ValueError:
        port = port_text
    port = _check_port(port, err)
    labels: dict[str, str] = {}
    for part in label_parts:
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise err("labels", f"{part!r} must look like label=value")
        labels[key.strip()] = value.strip()
    return Endpoint(name=name, address=address, port=port, labels=labels)


def parse_endpoint_args(args: Iterable[str], source: str = "--endpoint") -> list[Endpoint]:
    """Several `--endpoint` strings, with duplicate names and address:ports refused."""
    endpoints: list[Endpoint] = []
    names: dict[str, str] = {}
    hostports: dict[str, str] = {}
    for text in args:
        ep = parse_endpoint_arg(text, source)
        if ep.name in names:
            raise EndpointsError(
                f"duplicate name {ep.name!r} (also in {names[ep.name]!r})", source, repr(text)
            )
        if ep.hostport in hostports:
            raise EndpointsError(
                f"{ep.hostport} is already used by {hostports[ep.hostport]!r}", source, repr(text)
            )
        names[ep.name] = text
        hostports[ep.hostport] = text
        endpoints.append(ep)
    return endpoints


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


async def watch_endpoints_file(
    path: str | os.PathLike[str],
    datastore: Datastore,
    interval: float = 1.0,
    extra: Sequence[Endpoint] = (),
) -> None:
    """Keep the datastore's pool equal to the file at `path`; runs until cancelled.

    The file is read at once, then again whenever its mtime, size or inode changes
    (polled every `interval` seconds: portable, and cheap for one small file). A file
    that is missing or fails to load or validate is logged, once per change, and the
    current pool is kept. The pool is replaced only when the list actually differs.
    `extra` endpoints (from `--endpoint` flags) stay in the pool beside the file's.
    Callers usually load the file first with `load_endpoints_file`, so a bad file at
    start-up is a hard error; this reading is then a no-op.
    """
    p = Path(path)
    last: tuple[int, int, int] | None = (-1, -1, -1)  # never a real stat: read at once
    while True:
        key = _stat_key(p)
        if key != last:
            last = key
            _reload(p, datastore, key is not None, extra)
        await asyncio.sleep(interval)


def _reload(path: Path, datastore: Datastore, exists: bool, extra: Sequence[Endpoint]) -> None:
    if not exists:
        log.error("endpoints file %s is missing; keeping the %d endpoints", path, len(datastore))
        return
    try:
        endpoints = load_endpoints_file(path)
    except EndpointsError as e:
        log.error("endpoints file not reloaded, keeping the current pool: %s", e)
        return
    taken = {e.name for e in endpoints} | {e.hostport for e in endpoints}
    clashes = [e.name for e in extra if e.name in taken or e.hostport in taken]
    if clashes:
        log.error(
            "endpoints file %s not reloaded: it names %s, also given by --endpoint",
            path,
            ", ".join(clashes),
        )
        return
    endpoints = [*endpoints, *extra]
    if endpoints != datastore.endpoints():
        log.info("endpoints file %s loaded: %d endpoints", path, len(endpoints) - len(extra))
        datastore.set_endpoints(endpoints)
