"""`epp sidecar`: run the P/D sidecar in front of one decode server until SIGINT/SIGTERM.

Prints `epp sidecar listening on URL -> decode URL` (flushed) once it serves, which
scripts and tests wait for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from epp.datalayer.endpoints_file import EndpointsError
from epp.sidecar.proxy import Sidecar, SidecarOptions

log = logging.getLogger("epp.sidecar")
_D = SidecarOptions(decode_url="")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=_D.host, help=f"address to bind ({_D.host})")
    p.add_argument(
        "--port", type=int, default=_D.port,
        help=f"port to serve on: the one the pool lists for this decode server ({_D.port})",
    )  # fmt: skip
    target = p.add_mutually_exclusive_group()
    target.add_argument("--decode-url", help="the local decode server, e.g. http://127.0.0.1:8001")
    target.add_argument(
        "--decode-port", type=int, default=8001,
        help="the local decode server's port on 127.0.0.1 (8001, llm-d's --vllm-port)",
    )  # fmt: skip
    p.add_argument(
        "--allow", action="append", default=[], metavar="HOST:PORT",
        help="a prefill server the x-prefiller-host-port header may name (repeatable; "
        "a bare HOST allows any port)",
    )  # fmt: skip
    p.add_argument(
        "--allow-from-endpoints", metavar="FILE",
        help="allow every endpoint of this endpoints YAML (the file epp serve --endpoints "
        "reads); re-read when it changes",
    )  # fmt: skip
    p.add_argument(
        "--prefill-timeout", type=float, default=_D.prefill_timeout, metavar="SECONDS",
        help=f"a prefill leg taking longer falls back to a local decode ({_D.prefill_timeout:g})",
    )  # fmt: skip
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def options_from_args(args: argparse.Namespace) -> SidecarOptions:
    if args.prefill_timeout <= 0:
        raise ValueError("--prefill-timeout must be > 0")
    decode_url = args.decode_url or f"http://127.0.0.1:{args.decode_port}"
    if not decode_url.startswith(("http://", "https://")):
        raise ValueError(f"--decode-url {decode_url!r} must start with http:// or https://")
    return SidecarOptions(
        decode_url=decode_url,
        host=args.host,
        port=args.port,
        allow=tuple(args.allow),
        allow_from_endpoints=args.allow_from_endpoints,
        prefill_timeout=args.prefill_timeout,
    )


async def _serve(options: SidecarOptions) -> None:
    sidecar = Sidecar(options)
    await sidecar.start()
    if not len(sidecar.allowlist):
        log.warning(
            "the prefill allowlist is empty (--allow / --allow-from-endpoints): every "
            "request naming a prefill server will get 403"
        )
    print(
        f"epp sidecar listening on {sidecar.url} -> decode {sidecar.decode_url} "
        f"(prefill allowlist: {sidecar.allowlist.describe()})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await sidecar.stop()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        options = options_from_args(args)
        Sidecar(options)  # validates the allowlist before any port is opened
    except (ValueError, EndpointsError) as e:
        print(f"epp sidecar: {e}", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(options))
    except OSError as e:  # typically the port is taken
        print(f"epp sidecar: {e}", file=sys.stderr)
        return 1
    return 0
