"""`make load`: a local pool (simulators, `epp serve`, Envoy) under headless locust.

    python -m epp.harness.load --users 16 --run-time 60 --out load-report

starts the stack of `epp.harness.localstack`, runs `loadtest/locustfile.py` against its
Envoy for a bounded time, and leaves in `--out`: `report.html` (locust's HTML report),
`locust_stats.csv` / `locust_stats_history.csv` / `locust_failures.csv` /
`locust_exceptions.csv` (its CSV, rewritten once a second while it runs),
`locust_final.json` (its final statistics), `summary.json` (what this module read back
from them), and `logs/` (every process's output). Exit status 0 only if requests were made,
none failed, and TTFT was recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from epp.harness.localstack import LocalStack

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
DEFAULT_CONFIG = ROOT / "config" / "prefix-aware.yaml"
LORA_ADAPTERS = ("lora-a", "lora-b")
# Simulated servers fast enough that a short run makes hundreds of requests, with a queue
# once more than 4 requests run on one server; both adapters fit in a batch.
DEFAULT_SIM_ARGS = (
    "--max-num-seqs", "4", "--decode-ms-per-token", "4", "--prefill-ms-per-token", "0.01",
    "--lora-modules", *LORA_ADAPTERS, "--max-loras", "2",
)  # fmt: skip


@dataclass(frozen=True)
class LoadOptions:
    users: int = 16
    spawn_rate: float = 4.0
    run_time_s: int = 60
    n_sims: int = 3
    config: Path = DEFAULT_CONFIG
    out_dir: Path = ROOT / "load-report"
    sim_args: Sequence[str] = DEFAULT_SIM_ARGS
    # locust user classes to run (empty: all, by weight)
    user_classes: Sequence[str] = ()
    # extra `--name value` options for the locustfile (e.g. --long-prompt-words 500)
    locust_args: Sequence[str] = ()


@dataclass(frozen=True)
class StatRow:
    """One entry of locust's statistics (times in ms): type POST, or METRIC for the
    locustfile's derived TTFT / ITL / E2E samples."""

    type: str
    name: str
    requests: int
    failures: int
    median_ms: float
    p95_ms: float
    p99_ms: float
    rps: float


@dataclass(frozen=True)
class LoadSummary:
    rows: list[StatRow] = field(default_factory=list)
    locust_exit: int = 0
    out_dir: str = ""

    def row(self, type_: str, name: str) -> StatRow | None:
        return next((r for r in self.rows if r.type == type_ and r.name == name), None)

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.rows if r.type == "POST")

    @property
    def failures(self) -> int:
        return sum(r.failures for r in self.rows)

    def problems(self) -> list[str]:
        """Why this run is not a pass (empty: it is)."""
        out = []
        if self.requests == 0:
            out.append("no request was made")
        if self.failures:
            out.append(f"{self.failures} failures (see locust_failures.csv)")
        ttft = self.row("METRIC", "TTFT")
        if ttft is None or ttft.requests == 0:
            out.append("no TTFT recorded")
        if self.locust_exit != 0:
            out.append(f"locust exited {self.locust_exit}")
        return out


def percentile(response_times: dict[int, int], n: int, q: float) -> float:
    """The response time `q` of the `n` requests finished within, from locust's histogram
    (ms → count): locust's own rule (`locust/stats.py`, calculate_response_time_percentile),
    so the figures match its report."""
    target = int(n * q)
    seen = 0
    for ms in sorted(response_times, reverse=True):
        seen += response_times[ms]
        if n - seen <= target:
            return float(ms)
    return 0.0


def read_final_stats(path: Path) -> list[StatRow]:
    """Locust's `--json-file` output: its final statistics, one entry per (type, name).

    Read instead of `_stats.csv`, which locust rewrites once a second while it runs and
    so can miss the requests that ended during the last second and the stop timeout.
    """
    entries = json.loads(path.read_text())
    # rates over the whole run (first request of any kind to the last), as locust's report
    start = min((e["start_time"] for e in entries), default=0.0)
    end = max((e["last_request_timestamp"] or 0.0 for e in entries), default=0.0)
    span = end - start
    rows = []
    for e in entries:
        times = {int(ms): int(count) for ms, count in e["response_times"].items()}
        n = e["num_requests"]
        rows.append(
            StatRow(
                type=e["method"] or "",
                name=e["name"],
                requests=n,
                failures=e["num_failures"],
                median_ms=percentile(times, n, 0.5),
                p95_ms=percentile(times, n, 0.95),
                p99_ms=percentile(times, n, 0.99),
                rps=n / span if span > 0 else 0.0,
            )
        )
    return sorted(rows, key=lambda r: (r.type, r.name))


def locust_argv(host: str, options: LoadOptions) -> list[str]:
    out = options.out_dir
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "--host", host,
        "-u", str(options.users), "-r", str(options.spawn_rate),
        "-t", f"{options.run_time_s}s", "--stop-timeout", "30",
        "--csv", str(out / "locust"), "--csv-full-history", "--html", str(out / "report.html"),
        "--json-file", str(out / "locust_final"),
        "--only-summary", "--loglevel", "WARNING",
        "--lora-adapters", ",".join(LORA_ADAPTERS),
        *options.locust_args, *options.user_classes,
    ]  # fmt: skip


def run(options: LoadOptions) -> LoadSummary:
    """Start the pool, run locust against it to the end, read its CSV back."""
    options.out_dir.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(
        n_sims=options.n_sims,
        sim_args=list(options.sim_args),
        epp_args=["--config", str(options.config)],
        run_dir=options.out_dir / "logs",
    )
    with stack:
        argv = locust_argv(stack.url, options)
        with (options.out_dir / "logs" / "locust.log").open("wb") as log:
            done = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, timeout=options.run_time_s + 120
            )
    summary = LoadSummary(
        rows=read_final_stats(options.out_dir / "locust_final.json"),
        locust_exit=done.returncode,
        out_dir=str(options.out_dir),
    )
    (options.out_dir / "summary.json").write_text(
        json.dumps({**asdict(summary), "problems": summary.problems()}, indent=2)
    )
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m epp.harness.load", description=__doc__.split("\n")[0]
    )
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--spawn-rate", type=float, default=4.0)
    p.add_argument("--run-time", type=int, default=60, metavar="SECONDS")
    p.add_argument("--sims", type=int, default=3)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--out", type=Path, default=ROOT / "load-report")
    p.add_argument("classes", nargs="*", help="locust user classes to run (default: all)")
    args = p.parse_args(argv)
    for name, value in (("--users", args.users), ("--run-time", args.run_time)):
        if value < 1:
            p.error(f"{name} must be >= 1")
    if not args.config.is_file():
        p.error(f"--config {args.config}: no such file")
    options = LoadOptions(
        users=args.users,
        spawn_rate=args.spawn_rate,
        run_time_s=args.run_time,
        n_sims=args.sims,
        config=args.config,
        out_dir=args.out,
        user_classes=args.classes,
    )
    summary = run(options)
    for r in summary.rows:
        print(
            f"{r.type or '-':7} {r.name:16} {r.requests:7} req {r.failures:5} fail  "
            f"median {r.median_ms:7.0f} ms  p95 {r.p95_ms:7.0f} ms  {r.rps:6.1f}/s"
        )
    print(f"report: {options.out_dir / 'report.html'}  csv: {options.out_dir}/locust_*.csv")
    problems = summary.problems()
    for problem in problems:
        print(f"load: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
