"""`make load`, short: headless locust (loadtest/locustfile.py) against a local pool of 3
simulators, `epp serve` (config/prefix-aware.yaml) and Envoy, for a few seconds; the
assertions read locust's own CSV and HTML report back."""

from __future__ import annotations

import pytest

from epp.harness.load import LORA_ADAPTERS, LoadOptions, run

pytestmark = pytest.mark.e2e


def test_a_short_locust_run_makes_every_workload_without_failures_and_records_ttft(tmp_path):
    options = LoadOptions(
        # 9 users = the classes' weights 4 + 2 + 1 + 2: locust gives each class its weight
        users=9,
        spawn_rate=9,
        run_time_s=6,
        out_dir=tmp_path,
        # shorter prompts than the defaults: this run checks the plumbing, not the pool
        locust_args=["--system-prompt-words", "150", "--long-prompt-words", "800"],
    )
    summary = run(options)

    assert summary.problems() == [], summary.problems()
    posts = {r.name: r for r in summary.rows if r.type == "POST"}
    # every workload made requests (each user's first task runs to its end: --stop-timeout),
    # none failed; LoRA users take the models in turn (how many turns fit in 6 s varies)
    lora = {f"lora:{m}" for m in ("tiny", *LORA_ADAPTERS)}
    assert {"chat", "long-prompt", "stream"} <= set(posts), sorted(posts)
    assert set(posts) - {"chat", "long-prompt", "stream"} <= lora, sorted(posts)
    assert set(posts) & lora, sorted(posts)
    assert all(r.requests > 0 and r.failures == 0 for r in posts.values()), posts
    # TTFT for every streamed request (chat, long-prompt, stream and half of LoRA's);
    # ITL for those with more than one token chunk (the 64-token streams at least)
    ttft, itl = summary.row("METRIC", "TTFT"), summary.row("METRIC", "ITL")
    assert ttft is not None and itl is not None
    streamed = sum(posts[n].requests for n in ("chat", "long-prompt", "stream"))
    assert streamed <= ttft.requests <= streamed + sum(posts[n].requests for n in lora & set(posts))
    assert itl.requests >= posts["stream"].requests > 0
    assert ttft.median_ms > 0
    html = (tmp_path / "report.html").read_text()
    assert "TTFT" in html and "long-prompt" in html
