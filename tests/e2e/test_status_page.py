"""The live status page (`/` on the EPP's metrics port) in headless Chromium.

A real pool (three `epp sim` processes, `epp serve` with the prefix-aware config, Envoy):
the page loads, lists the three endpoints as healthy, shows the scheduling decisions and
their per-scorer scores after traffic and the prefix index; when one simulator is killed
the page, without a reload, marks that endpoint unhealthy (the EPP's staleness threshold,
2 s by default) and keeps the other two healthy.

`EPP_STATUS_SCREENSHOT=docs/status-page.png` also writes the screenshot shown in
docs/observability.md. `make test` installs Debian's chromium when missing.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest

from epp.harness.localstack import LocalStack
from epp.harness.procs import ProcessGroup
from tests.e2e.cdp import Page, chromium_binary, start_chromium

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "prefix-aware.yaml"
SIM_ARGS = ["--max-num-seqs", "4", "--decode-ms-per-token", "2"]

ROWS = "[...document.querySelectorAll('#endpoints tr.endpoint')]"
HEALTH = f"Object.fromEntries({ROWS}.map(r => [r.dataset.name, r.dataset.healthy]))"


async def chat_turns(url: str, n: int) -> list[int]:
    """`n` requests sharing a long system prompt (so the prefix index has hits)."""
    system = "You answer questions about the weather in short sentences. " * 20
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        out = []
        for i in range(n):
            body = {
                "model": "tiny",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"And on day {i}?"},
                ],
                "max_tokens": 4,
            }
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
                out.append(r.status)
        return out


def test_status_page_shows_the_pool_and_follows_a_dying_endpoint(tmp_path):
    if chromium_binary() is None:
        pytest.fail(
            "chromium not found: `make test` installs Debian's chromium package "
            "(scripts/system-packages.sh), or run `apt-get install chromium`"
        )
    with (
        LocalStack(n_sims=3, sim_args=SIM_ARGS, epp_args=["--config", str(CONFIG)]) as st,
        ProcessGroup(tmp_path / "browser") as pg,
    ):
        assert asyncio.run(chat_turns(st.url, 12)) == [200] * 12
        _, port = start_chromium(pg, tmp_path / "profile")
        asyncio.run(drive(st, port))


async def drive(st: LocalStack, port: int) -> None:
    async with aiohttp.ClientSession() as session:
        page = await Page.open(session, port)
        await page.navigate(st.epp_metrics_url + "/")
        health = await page.wait_for(f"{ROWS}.length === 3 && {HEALTH}", "three endpoint rows")
        assert health == {"sim-0": "true", "sim-1": "true", "sim-2": "true"}

        # 12 routed requests: the ring shows them newest first, each with its scorers.
        total = await page.wait_for(
            "document.getElementById('dtotal').textContent", "the decisions header"
        )
        assert total == "(last 12 of 12)"
        first = await page.evaluate(
            "document.querySelector('#decisions tr.decision').children[5].textContent"
        )
        # prefix-aware.yaml's scorers, each named with its weight, with a score per endpoint.
        assert "token-load-scorer×" in first and "prefix-cache-scorer×" in first, first
        # The shared system prompt: every request after the first hit the prefix index.
        hit_rate = await page.evaluate(
            "[...document.querySelectorAll('#prefix .card')]"
            ".find(c => c.textContent.endsWith('hit rate')).firstChild.textContent"
        )
        assert hit_rate.endswith(" %") and float(hit_rate[:-2]) > 50, hit_rate
        assert "no planner" in await page.evaluate("document.getElementById('planner').textContent")

        st.kill_sim(1)
        health = await page.wait_for(
            f"{HEALTH}['sim-1'] === 'false' && {HEALTH}", "sim-1 to turn unhealthy", 30
        )
        assert health == {"sim-0": "true", "sim-1": "false", "sim-2": "true"}
        cell = await page.evaluate(f"{ROWS}.find(r => r.dataset.name === 'sim-1').children[3]"
                                   ".textContent")  # fmt: skip
        assert cell == "unhealthy"

        png = await page.screenshot()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        target = os.environ.get("EPP_STATUS_SCREENSHOT")
        if target:
            Path(target).write_bytes(png)
        await page.ws.close()
