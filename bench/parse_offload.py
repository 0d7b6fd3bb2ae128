"""Where to parse request bodies: on the event loop, or in a worker thread?

For bodies of growing size and three shapes (one long prompt, many chat messages, a
prompt of token ids), parse with `epp.request.parse_body` on the loop and via
`asyncio.to_thread`, while a ticker task sleeps 1 ms at a time on the same loop. The
figure that matters is the ticker's longest gap: how long every other stream would
wait. Medians of --repeats runs. Chooses `epp.extproc.stream.PARSE_OFF_LOOP_BYTES`.

    .venv/bin/python bench/parse_offload.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from epp.request import new_request, parse_body

SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20, 28 << 20)


def make_body(shape: str, size: int) -> tuple[str, bytes]:
    if shape == "prompt":
        return "/v1/completions", json.dumps(
            {"model": "m", "prompt": "word " * (size // 5)}
        ).encode()
    if shape == "messages":
        msg = {"role": "user", "content": "hello there general kenobi"}
        return "/v1/chat/completions", json.dumps(
            {"model": "m", "messages": [msg] * (size // 60)}
        ).encode()
    return "/v1/completions", json.dumps({"model": "m", "prompt": list(range(size // 7))}).encode()


async def one_run(path: str, raw: bytes, off_loop: bool) -> tuple[float, float]:
    """(parse wall time, the loop's longest stall) in seconds."""
    gaps: list[float] = []
    stop = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    req = new_request({}, path, "POST")
    t0 = time.perf_counter()
    if off_loop:
        await asyncio.to_thread(parse_body, req, raw)
    else:
        parse_body(req, raw)
    wall = time.perf_counter() - t0
    await asyncio.sleep(0.01)
    stop = True
    await task
    return wall, max(gaps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    for shape in ("prompt", "messages", "ids"):
        for size in SIZES:
            path, raw = make_body(shape, size)
            row: dict[str, object] = {"shape": shape, "kib": len(raw) // 1024}
            for label, off in (("loop", False), ("thread", True)):
                runs = [asyncio.run(one_run(path, raw, off)) for _ in range(args.repeats)]
                row[f"{label}_parse_ms"] = round(statistics.median(r[0] for r in runs) * 1e3, 1)
                row[f"{label}_stall_ms"] = round(statistics.median(r[1] for r in runs) * 1e3, 1)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
