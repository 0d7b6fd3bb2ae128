"""Performance interpolation over the profiler's measurements (reference §3).

Prefill: TTFT (ms, batch size 1, no KV reuse) and prefill tokens/s per GPU against ISL.
Decode: ITL (ms) and output tokens/s per GPU against (KV use, context length), and the
inverse `find_best_throughput_per_gpu(itl, context)`: the most a GPU can decode while
the ITL stays within a target.

The arrays and their names are Dynamo's (`perf_interpolation.py`, SLA-v1), so a profile
written by Dynamo's profiler or by `epp profile` reads the same. The interpolation is
Dynamo's too: scipy `interp1d(kind="cubic")` for prefill, `griddata(method="cubic")` on
a 100×100 grid with nearest-neighbour fill for decode, nearest grid cell on lookup. Why
not a simpler monotone piecewise-linear fit: the Dynamo-faithful baseline must see the
same numbers Dynamo would, or the comparison measures interpolators, not policies.
Three changes, all on inputs Dynamo would mishandle, none on its shipped data:

- values are clamped to the measured range (a cubic spline can overshoot between sparse
  points: a negative throughput would make a negative replica count);
- fewer than 4 prefill points fall back to linear (`interp1d` cubic refuses them), and
  decode points on one line (a single context length) to nearest (Qhull refuses them);
- `find_best_throughput_per_gpu` says whether the ITL target was met: Dynamo returns the
  lowest-KV cell when nothing qualifies and its caller never checks (reference §3.3).

Everything here is pure except `load_profile(dir)`, the one function that reads files.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.interpolate import griddata, interp1d
from scipy.spatial import QhullError

RESOLUTION = 100  # Dynamo's DecodeInterpolator default grid
PREFILL_ARRAYS = ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu")
DECODE_ARRAYS = ("x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu", "max_kv_tokens")
PREFILL_NPZ = "selected_prefill_interpolation/raw_data.npz"
DECODE_NPZ = "selected_decode_interpolation/raw_data.npz"
PREFILL_JSON = "prefill_raw_data.json"  # the ConfigMap fallback Dynamo's profiler writes
DECODE_JSON = "decode_raw_data.json"
RERUN = "re-run epp profile"


class ProfileError(ValueError):
    """Profile data missing or unusable; the message names the file, the array and the fix."""


def _vector(name: str, value: Any, source: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise ProfileError(f"{source}: array '{name}' is not numeric; {RERUN}") from None
    if arr.size == 0:
        raise ProfileError(f"{source}: array '{name}' is empty; {RERUN}")
    if not np.all(np.isfinite(arr)):
        raise ProfileError(f"{source}: array '{name}' has NaN or infinite values; {RERUN}")
    return arr


def _same_length(source: str, **arrays: np.ndarray) -> None:
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{k}={n}" for k, n in lengths.items())
        raise ProfileError(f"{source}: arrays differ in length ({listed}); {RERUN}")


def _clamp(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


@dataclass(frozen=True, eq=False)
class PrefillPerf:
    """TTFT and throughput per GPU against ISL; ISL is clamped to the measured range."""

    isl: np.ndarray
    ttft_ms: np.ndarray
    thpt: np.ndarray
    method: str
    _ttft: Any
    _thpt: Any

    @classmethod
    def from_arrays(
        cls,
        prefill_isl: Any,
        prefill_ttft: Any,
        prefill_thpt_per_gpu: Any,
        *,
        source: str = "prefill profile",
    ) -> PrefillPerf:
        isl = _vector("prefill_isl", prefill_isl, source)
        ttft = _vector("prefill_ttft", prefill_ttft, source)
        thpt = _vector("prefill_thpt_per_gpu", prefill_thpt_per_gpu, source)
        _same_length(source, prefill_isl=isl, prefill_ttft=ttft, prefill_thpt_per_gpu=thpt)
        order = np.argsort(isl, kind="stable")
        isl, ttft, thpt = isl[order], ttft[order], thpt[order]
        if len(isl) < 2 or np.any(np.diff(isl) <= 0):
            raise ProfileError(
                f"{source}: 'prefill_isl' needs at least 2 distinct ISLs, got {isl.tolist()}; "
                f"{RERUN}"
            )
        if np.any(ttft <= 0) or np.any(thpt <= 0):
            raise ProfileError(f"{source}: TTFT and throughput must be positive; {RERUN}")
        kind = "cubic" if len(isl) >= 4 else "linear"
        return cls(
            isl, ttft, thpt, kind, interp1d(isl, ttft, kind=kind), interp1d(isl, thpt, kind=kind)
        )

    def _at(self, fn: Any, ys: np.ndarray, isl: float) -> float:
        x = _clamp(float(isl), float(self.isl[0]), float(self.isl[-1]))
        return _clamp(float(fn(x)), float(ys.min()), float(ys.max()))

    def ttft(self, isl: float) -> float:
        """Batch-1 TTFT in ms of a prompt of `isl` uncached tokens."""
        return self._at(self._ttft, self.ttft_ms, isl)

    def thpt_per_gpu(self, isl: float) -> float:
        """Prefill tokens/s per GPU at this ISL."""
        return self._at(self._thpt, self.thpt, isl)

    @property
    def max_isl(self) -> float:
        return float(self.isl[-1])


@dataclass(frozen=True, slots=True)
class BestThroughput:
    """The busiest decode operating point within an ITL target, at one context length."""

    thpt_per_gpu: float  # output tokens/s per GPU
    itl_ms: float  # the interpolated ITL at that point
    kv_usage: float  # 0..1, the grid column chosen
    met: bool  # False: no point meets the target; the values are the lowest-KV cell's


@dataclass(frozen=True, eq=False)
class DecodePerf:
    """ITL and throughput per GPU on Dynamo's 100×100 (KV use × context) grid."""

    max_kv_tokens: int
    xi: np.ndarray  # KV use, linspace(0, 1)
    yi: np.ndarray  # context length, linspace(0, max measured context)
    itl_grid: np.ndarray  # [iy, ix]
    thpt_grid: np.ndarray
    method: str

    @classmethod
    def from_arrays(
        cls,
        x_kv_usage: Any,
        y_context_length: Any,
        z_itl: Any,
        z_thpt_per_gpu: Any,
        max_kv_tokens: Any,
        *,
        resolution: int = RESOLUTION,
        source: str = "decode profile",
    ) -> DecodePerf:
        x = _vector("x_kv_usage", x_kv_usage, source)
        y = _vector("y_context_length", y_context_length, source)
        itl = _vector("z_itl", z_itl, source)
        thpt = _vector("z_thpt_per_gpu", z_thpt_per_gpu, source)
        _same_length(source, x_kv_usage=x, y_context_length=y, z_itl=itl, z_thpt_per_gpu=thpt)
        kv = _vector("max_kv_tokens", max_kv_tokens, source)
        if kv.size != 1 or kv[0] < 1:
            raise ProfileError(
                f"{source}: 'max_kv_tokens' must be one positive count, got {kv.tolist()}; {RERUN}"
            )
        if np.any(y <= 0) or np.any(itl <= 0) or np.any(thpt < 0) or np.any(x < 0):
            raise ProfileError(
                f"{source}: context lengths and ITLs must be positive, KV use and "
                f"throughput not negative; {RERUN}"
            )
        if resolution < 2:
            raise ProfileError(f"{source}: resolution must be at least 2")
        xi = np.linspace(0.0, 1.0, resolution)
        yi = np.linspace(0.0, float(y.max()), resolution)
        grid_x, grid_y = np.meshgrid(xi, yi)
        try:
            itl_grid = _fill(x, y, itl, grid_x, grid_y, "cubic")
            thpt_grid = _fill(x, y, thpt, grid_x, grid_y, "cubic")
            method = "cubic"
        except (QhullError, ValueError):
            itl_grid = griddata((x, y), itl, (grid_x, grid_y), method="nearest")
            thpt_grid = griddata((x, y), thpt, (grid_x, grid_y), method="nearest")
            method = "nearest"
        itl_grid = np.clip(itl_grid, itl.min(), itl.max())
        thpt_grid = np.clip(thpt_grid, thpt.min(), thpt.max())
        return cls(int(kv[0]), xi, yi, itl_grid, thpt_grid, method)

    @property
    def resolution(self) -> int:
        return len(self.xi)

    def _row(self, context_length: float) -> int:
        step = self.yi[1] - self.yi[0]
        return int(np.clip(np.round((context_length - self.yi[0]) / step), 0, len(self.yi) - 1))

    def _col(self, kv_usage: float) -> int:
        step = self.xi[1] - self.xi[0]
        return int(np.clip(np.round((kv_usage - self.xi[0]) / step), 0, len(self.xi) - 1))

    def kv_usage(self, concurrency: float, context_length: float) -> float:
        """Share of one engine's KV cache `concurrency` requests of this context hold."""
        return concurrency * context_length / self.max_kv_tokens

    def itl(self, concurrency: float, context_length: float) -> float:
        """ITL (ms) with `concurrency` requests in flight on one engine."""
        col = self._col(self.kv_usage(concurrency, context_length))
        return float(self.itl_grid[self._row(context_length), col])

    def thpt_per_gpu(self, concurrency: float, context_length: float) -> float:
        col = self._col(self.kv_usage(concurrency, context_length))
        return float(self.thpt_grid[self._row(context_length), col])

    def concurrency_at(self, kv_usage: float, context_length: float) -> float:
        """Requests in flight on one engine at this KV use (the inverse of kv_usage)."""
        return kv_usage * self.max_kv_tokens / max(context_length, 1.0)

    def find_best_throughput_per_gpu(self, itl: float, context_length: float) -> BestThroughput:
        """Scan the context's row from the highest KV use down and take the first cell
        whose ITL is within `itl` (a scan, not a bisection: the interpolated ITL need not
        be monotonic). None qualifying: the lowest-KV cell with `met=False`."""
        iy = self._row(context_length)
        row = self.itl_grid[iy]
        for ix in range(len(self.xi) - 1, -1, -1):
            if row[ix] <= itl:
                return BestThroughput(
                    float(self.thpt_grid[iy, ix]), float(row[ix]), float(self.xi[ix]), True
                )
        return BestThroughput(float(self.thpt_grid[iy, 0]), float(row[0]), float(self.xi[0]), False)

    def least_itl_point(self, context_length: float) -> BestThroughput:
        """When no point meets an ITL target: the point with the lowest ITL among those
        that produce tokens (more than 0.1 % of the row's best; Dynamo's fallback, the
        KV-0 cell, may produce none)."""
        iy = self._row(context_length)
        floor = 1e-3 * float(self.thpt_grid[iy].max())  # interpolation noise is not output
        producing = [ix for ix in range(len(self.xi)) if self.thpt_grid[iy, ix] > floor]
        if not producing:
            return BestThroughput(0.0, float(self.itl_grid[iy, 0]), 0.0, False)
        ix = min(producing, key=lambda i: (self.itl_grid[iy, i], -i))
        return BestThroughput(
            float(self.thpt_grid[iy, ix]), float(self.itl_grid[iy, ix]), float(self.xi[ix]), False
        )


def _fill(
    x: np.ndarray, y: np.ndarray, z: np.ndarray, gx: np.ndarray, gy: np.ndarray, method: str
) -> np.ndarray:
    """griddata, with cells outside the points' convex hull taken from the nearest point."""
    grid = griddata((x, y), z, (gx, gy), method=method)
    holes = np.isnan(grid)
    if np.any(holes):
        grid[holes] = griddata((x, y), z, (gx, gy), method="nearest")[holes]
    return grid


@dataclass(frozen=True, eq=False)
class Profile:
    """One engine type's measured performance: what the SLA policies size against."""

    prefill: PrefillPerf
    decode: DecodePerf
    source: str = ""

    @classmethod
    def from_arrays(
        cls, prefill: Mapping[str, Any], decode: Mapping[str, Any], source: str = ""
    ) -> Profile:
        """From two mappings keyed by Dynamo's array names (reference §3.1)."""
        return cls(
            PrefillPerf.from_arrays(**_pick(prefill, PREFILL_ARRAYS, source or "prefill")),
            DecodePerf.from_arrays(**_pick(decode, DECODE_ARRAYS, source or "decode")),
            source,
        )


def _pick(data: Mapping[str, Any], names: tuple[str, ...], source: str) -> dict[str, Any]:
    for name in names:
        if name not in data:
            raise ProfileError(f"{source} has no array '{name}'; {RERUN}")
    return {name: data[name] for name in names} | {"source": source}


# --- the one function that reads files -------------------------------------------------


def load_profile(directory: str | Path) -> Profile:
    """Read `<dir>/selected_{prefill,decode}_interpolation/raw_data.npz`, or the JSON
    ConfigMap fallback `<dir>/{prefill,decode}_raw_data.json` (Dynamo's order)."""
    root = Path(directory)
    if not root.is_dir():
        raise ProfileError(f"profile-results-dir {root} is not a directory; run epp profile")
    prefill = _read(root, PREFILL_NPZ, PREFILL_JSON, PREFILL_ARRAYS)
    decode = _read(root, DECODE_NPZ, DECODE_JSON, DECODE_ARRAYS)
    return Profile(
        PrefillPerf.from_arrays(**prefill),
        DecodePerf.from_arrays(**decode),
        str(root),
    )


def _read(root: Path, npz: str, fallback: str, names: tuple[str, ...]) -> dict[str, Any]:
    npz_path, json_path = root / npz, root / fallback
    if npz_path.is_file():
        try:
            with np.load(npz_path, allow_pickle=False) as data:
                return _pick({k: data[k] for k in data.files}, names, str(npz_path))
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            if isinstance(e, ProfileError):
                raise
            raise ProfileError(f"{npz_path} is not a readable NPZ file ({e}); {RERUN}") from None
    if json_path.is_file():
        try:
            data = json.loads(json_path.read_text())
        except (OSError, ValueError) as e:
            raise ProfileError(f"{json_path} is not valid JSON ({e}); {RERUN}") from None
        if not isinstance(data, dict):
            raise ProfileError(f"{json_path} must hold a JSON object; {RERUN}")
        return _pick(data, names, str(json_path))
    raise ProfileError(f"no profile data: neither {npz_path} nor {json_path} exists; {RERUN}")
