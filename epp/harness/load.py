"""`make load`: a local pool (simulators, `epp serve`, Envoy) under headless locust.

    python -m epp.harness.load --users 16 --run-time 60 --out load-report

starts the stack of `epp.harness.localstack`, runs `loadtest/locustfile.py` against its
Envoy for a bounded time, and leaves in `--out`: `report.html` (locust's HTML report),
`locust_stats.csv` / `locust_stats_history.csv` / `locust_failures.csv` /
`locust_exceptions.csv` (its CSV), `summary.json` (what this module read back from the
CSV), and `logs/` (every process's output). Exit status 0 only if requests were made,
none failed, and TTFT was recorded.
"""

from __future__ import annotations

import argparse
import csv
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
    """One row of locust's `_stats.csv` (times in ms)."""

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
        return sum(r.failures for r in self.rows if r.type != "")

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


def _num(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:  # locust writes "N/A" for percentiles of an empty row
        return 0.0


def read_stats(path: Path) -> list[StatRow]:
    """Locust's `<prefix>_stats.csv`: one row per (type, name), then "Aggregated"."""
    with path.open(newline="") as f:
        return [
            StatRow(
                type=row["Type"],
                name=row["Name"],
                requests=int(row["Request Count"]),
                failures=int(row["Failure Count"]),
                median_ms=_num(row["Median Response Time"]),
                p95_ms=_num(row["95%"]),
                p99_ms=_num(row["99%"]),
                rps=_num(row["Requests/s"]),
            )
            for row in csv.DictReader(f)
        ]


def locust_argv(host: str, options: LoadOptions) -> list[str]:
    out = options.out_dir
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "--host", host,
        "-u", str(options.users), "-r", str(options.spawn_rate),
        "-t", f"{options.run_time_s}s", "--stop-timeout", "30",
        "--csv", str(out / "locust"), "--csv-full-history", "--html", str(out / "report.html"),
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
        rows=read_stats(options.out_dir / "locust_stats.csv"),
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
