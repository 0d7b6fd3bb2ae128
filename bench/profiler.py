"""Does `epp profile` over HTTP measure what the simulator's model says?

Starts `epp sim --preset PRESET --time-scale S`, runs `epp profile --url` against it,
runs `epp profile --virtual-preset PRESET` with the same plan (the simulator's own
scheduler and step-cost model in virtual time: the model's exact answer), and compares
the two NPZ files point by point, and the prefill TTFT interpolated halfway between the
grid points (linear in ISL).

    .venv/bin/python bench/profiler.py                  # 8B preset, time scale 1
    .venv/bin/python bench/profiler.py --time-scale 0.25 -- --decode-osl 200   # busy machine

Prints one row per point (HTTP / virtual, and the ratio) and the worst ratios; copies
the HTTP run's two PNGs to docs/profiler_{prefill,decode}.png with `--docs`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from epp.harness.procs import LogReady, ProcessGroup  # noqa: E402

PLAN = [
    "--isl", "3000", "--osl", "500", "--max-context-length", "8192",
    "--decode-granularity", "4", "--max-concurrency", "128", "--decode-osl", "300",
    "--ttft", "200", "--itl", "20",
]  # fmt: skip


def epp(*argv: str) -> None:
    cmd = [sys.executable, "-m", "epp.cli", *argv]
    print("$ epp " + " ".join(argv), flush=True)
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    if rc not in (0, 2):  # 2: SLA not met, data still written
        raise SystemExit(f"epp profile failed ({rc})")


def load(d: Path, kind: str) -> dict[str, np.ndarray]:
    with np.load(d / f"selected_{kind}_interpolation" / "raw_data.npz") as z:
        return {k: z[k] for k in z.files}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-3.1-8b-h100")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/epp-profile-bench"))
    ap.add_argument("--docs", action="store_true", help="copy the PNGs into docs/")
    ap.add_argument("extra", nargs="*", help="after --: more `epp profile` flags (override)")
    args = ap.parse_args()
    plan = [*PLAN, *args.extra]
    http_dir, virt_dir = args.out / "http", args.out / "virtual"
    with ProcessGroup() as pg:
        sim = pg.start(
            "sim",
            [sys.executable, "-m", "epp.cli", "sim", "--preset", args.preset,
             "--time-scale", str(args.time_scale), "--port", "0"],
            ready=LogReady(r"listening on http://"),
        )  # fmt: skip
        url = sim.output().split("listening on ")[1].split()[0]
        epp("profile", "--url", url, "--time-scale", str(args.time_scale), *plan,
            "-o", str(http_dir), "--no-progress")  # fmt: skip
    epp("profile", "--virtual-preset", args.preset, *plan, "-o", str(virt_dir), "--no-progress")

    hp, vp = load(http_dir, "prefill"), load(virt_dir, "prefill")
    assert (hp["prefill_isl"] == vp["prefill_isl"]).all()
    sweep = json.loads((http_dir / "summary.json").read_text())["sweep"]
    print("\nprefill: ISL, TTFT ms client / sim's own histogram / virtual, client/virtual")
    ratios, server_r = [], []
    for i, (isl, h, v) in enumerate(
        zip(hp["prefill_isl"], hp["prefill_ttft"], vp["prefill_ttft"], strict=True)
    ):
        s = sweep["prefill"][i]["server_ttft_ms"]
        ratios.append(h / v)
        server_r.append(s / v)
        print(f"  {isl:6d} {h:9.2f} {s:9.2f} {v:9.2f} {h / v:6.3f}")
    mid = (hp["prefill_isl"][:-1] + hp["prefill_isl"][1:]) / 2
    hi = np.interp(mid, hp["prefill_isl"], hp["prefill_ttft"])
    vi = np.interp(mid, vp["prefill_isl"], vp["prefill_ttft"])
    mid_ratios = hi / vi
    print(
        f"prefill TTFT ratio at grid points: min {min(ratios):.3f} median "
        f"{float(np.median(ratios)):.3f} max {max(ratios):.3f}; interpolated midpoints: "
        f"min {mid_ratios.min():.3f} max {mid_ratios.max():.3f}"
    )

    hd, vd = load(http_dir, "decode"), load(virt_dir, "decode")
    print(f"prefill TTFT, sim's own / virtual: min {min(server_r):.3f} max {max(server_r):.3f}")
    print(
        "\ndecode: context, kv usage, ITL ms client / sim's own histogram / virtual,"
        " client/virtual, client/sim, tok/s/GPU client / virtual"
    )
    itl_r, thpt_r, own_r, client_own = [], [], [], []
    for i in range(len(vd["z_itl"])):
        h, v = hd["z_itl"][i], vd["z_itl"][i]
        s = sweep["decode"][i]["server_itl_ms"]
        ht, vt = hd["z_thpt_per_gpu"][i], vd["z_thpt_per_gpu"][i]
        itl_r.append(h / v)
        thpt_r.append(ht / vt)
        own_r.append(s / v)
        client_own.append(h / s)
        print(
            f"  {vd['y_context_length'][i]:7.0f} {vd['x_kv_usage'][i]:5.3f} {h:7.2f} {s:7.2f}"
            f" {v:7.2f} {h / v:6.3f} {h / s:6.3f} {ht:9.1f} {vt:9.1f}"
        )
    print(
        f"decode ITL client/virtual: min {min(itl_r):.3f} median {float(np.median(itl_r)):.3f}"
        f" max {max(itl_r):.3f}; client/sim's own: min {min(client_own):.3f} max"
        f" {max(client_own):.3f}; sim's own/virtual: min {min(own_r):.3f} max"
        f" {max(own_r):.3f}; throughput client/virtual: min {min(thpt_r):.3f} max"
        f" {max(thpt_r):.3f}"
    )
    if args.docs:
        for name in ("prefill", "decode"):
            shutil.copy(http_dir / f"{name}_performance.png", ROOT / f"docs/profiler_{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
