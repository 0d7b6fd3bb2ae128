"""Interpolation over a synthetic profile written as Dynamo's NPZ files.

The synthetic engine: prefill TTFT = 10 + isl/100 ms (linear, so a cubic spline
reproduces it exactly), throughput = isl / TTFT × 1000 tokens/s on 1 GPU; decode
ITL = 5 + 20 × kv_usage ms and throughput 4000 × kv_usage tok/s whatever the context
(linear again: the Clough-Tocher cubic
of griddata is exact on linear data inside the points' hull).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from epp.planner.core.perf import (
    DecodePerf,
    PrefillPerf,
    ProfileError,
    load_profile,
)

MAX_KV = 100_000


def prefill_arrays():
    isl = np.array([100, 1000, 2000, 4000, 8000])
    ttft = 10 + isl / 100  # 11, 20, 30, 50, 90 ms
    return {"prefill_isl": isl, "prefill_ttft": ttft, "prefill_thpt_per_gpu": isl / ttft * 1000}


def decode_arrays():
    kv, ctx = np.meshgrid([0.0, 0.25, 0.5, 0.75, 1.0], [100.0, 2000.0, 4000.0])
    kv, ctx = kv.ravel(), ctx.ravel()
    return {
        "x_kv_usage": kv,
        "y_context_length": ctx,
        "z_itl": 5 + 20 * kv,
        "z_thpt_per_gpu": 4000 * kv,
        "max_kv_tokens": np.array([MAX_KV]),
    }


def write_profile(root, prefill=None, decode=None):
    (root / "selected_prefill_interpolation").mkdir(parents=True, exist_ok=True)
    (root / "selected_decode_interpolation").mkdir(parents=True, exist_ok=True)
    np.savez(root / "selected_prefill_interpolation/raw_data.npz", **(prefill or prefill_arrays()))
    np.savez(root / "selected_decode_interpolation/raw_data.npz", **(decode or decode_arrays()))


def test_prefill_interpolates_and_clamps(tmp_path):
    write_profile(tmp_path)
    p = load_profile(tmp_path).prefill
    assert p.method == "cubic"
    assert p.ttft(1000) == pytest.approx(20.0)  # 10 + 1000/100
    assert p.ttft(3000) == pytest.approx(40.0)  # 10 + 3000/100, between grid points
    assert p.thpt_per_gpu(2000) == pytest.approx(2000 / 30 * 1000)  # a grid point: 66 667
    assert p.ttft(50) == pytest.approx(11.0)  # below the grid: clamped to ISL 100
    assert p.ttft(20_000) == pytest.approx(90.0)  # above: clamped to ISL 8000


def test_decode_itl_and_inverse_lookup(tmp_path):
    write_profile(tmp_path)
    d = load_profile(tmp_path).decode
    assert d.method == "cubic" and d.max_kv_tokens == MAX_KV
    # 30 requests × 2000 tokens / 100 000 = 0.6 KV -> ITL about 5 + 20×0.6 = 17 ms
    # (nearest column: round(0.6 × 99) = round(59.4) = 59 -> xi 59/99 -> 16.92 ms)
    assert d.itl(30, 2000) == pytest.approx(5 + 20 * 59 / 99)
    # ITL target 10 ms: 5 + 20 kv <= 10 -> kv <= 0.25; the highest column with
    # xi = ix/99 <= 0.25 is ix = 24 (0.2424) -> ITL 5 + 20 × 24/99 = 9.85 ms.
    # Context 3000: row round(3000 / (4000/99)) = round(74.25) = 74, inside the hull.
    best = d.find_best_throughput_per_gpu(10.0, 3000)
    assert best.met and best.kv_usage == pytest.approx(24 / 99)
    assert best.itl_ms == pytest.approx(5 + 20 * 24 / 99)
    assert best.thpt_per_gpu == pytest.approx(4000 * 24 / 99)  # 969.7 tok/s/GPU
    assert d.concurrency_at(best.kv_usage, 3000) == pytest.approx(0.2424 * MAX_KV / 3000, rel=1e-3)


def test_unreachable_itl_says_so():
    d = DecodePerf.from_arrays(**decode_arrays())
    best = d.find_best_throughput_per_gpu(4.0, 3000)  # below the 5 ms floor
    # Dynamo returns the ix = 0 cell silently; we return it with met=False
    assert not best.met and best.kv_usage == 0.0 and best.itl_ms == pytest.approx(5.0)
    assert best.thpt_per_gpu == pytest.approx(
        0.0, abs=1e-3
    )  # 4000 × 0: the KV-0 cell decodes nothing
    # the lowest ITL that produces tokens: column 1 (KV 1/99), ITL 5 + 20/99, 4000/99 tok/s
    floor = d.least_itl_point(3000)
    assert not floor.met and floor.kv_usage == pytest.approx(1 / 99)
    assert floor.thpt_per_gpu == pytest.approx(4000 / 99)


def test_few_prefill_points_and_one_context_fall_back():
    p = PrefillPerf.from_arrays([100, 1100], [11, 21], [9000, 52000])
    assert p.method == "linear" and p.ttft(600) == pytest.approx(16.0)  # halfway: (11+21)/2
    d = DecodePerf.from_arrays(
        [0.1, 0.5, 0.9], [2000, 2000, 2000], [6, 10, 14], [1, 2, 3], [MAX_KV]
    )
    assert d.method == "nearest"  # collinear points: Qhull cannot triangulate
    assert d.itl(45, 2000) == 14  # 45 × 2000 / 100 000 = 0.9 KV -> nearest point's 14 ms


def test_json_fallback(tmp_path):
    pre = {k: v.tolist() for k, v in prefill_arrays().items()}
    dec = {k: v.tolist() for k, v in decode_arrays().items()} | {"max_kv_tokens": MAX_KV}
    (tmp_path / "prefill_raw_data.json").write_text(json.dumps(pre))
    (tmp_path / "decode_raw_data.json").write_text(json.dumps(dec))
    prof = load_profile(tmp_path)
    assert prof.prefill.ttft(1000) == pytest.approx(20.0)
    assert prof.decode.max_kv_tokens == MAX_KV


def test_missing_array_names_file_array_and_fix(tmp_path):
    dec = decode_arrays()
    del dec["z_itl"]
    write_profile(tmp_path, decode=dec)
    with pytest.raises(ProfileError) as e:
        load_profile(tmp_path)
    msg = str(e.value)
    assert "selected_decode_interpolation/raw_data.npz has no array 'z_itl'" in msg
    assert "re-run epp profile" in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("prefill", "needle"),
    [
        (
            {"prefill_isl": [100, 100], "prefill_ttft": [1, 2], "prefill_thpt_per_gpu": [1, 2]},
            "at least 2 distinct ISLs",
        ),
        (
            {"prefill_isl": [1, 2, 3], "prefill_ttft": [1, 2], "prefill_thpt_per_gpu": [1, 2, 3]},
            "differ in length",
        ),
        (
            {"prefill_isl": [1, 2], "prefill_ttft": [1, np.nan], "prefill_thpt_per_gpu": [1, 2]},
            "'prefill_ttft' has NaN",
        ),
        (
            {"prefill_isl": [1, 2], "prefill_ttft": [0, 1], "prefill_thpt_per_gpu": [1, 2]},
            "must be positive",
        ),
    ],
)
def test_bad_prefill_arrays(prefill, needle):
    with pytest.raises(ProfileError, match=needle):
        PrefillPerf.from_arrays(**prefill)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(ProfileError, match="is not a directory"):
        load_profile(tmp_path / "nope")
    with pytest.raises(ProfileError, match=r"neither .*raw_data\.npz nor .*prefill_raw_data\.json"):
        load_profile(tmp_path)
    write_profile(tmp_path)
    (tmp_path / "selected_prefill_interpolation/raw_data.npz").write_bytes(b"not a zip")
    with pytest.raises(ProfileError, match="is not a readable NPZ file"):
        load_profile(tmp_path)
