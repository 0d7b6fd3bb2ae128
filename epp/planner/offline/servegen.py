"""ServeGen workloads: production client data -> a seeded request trace.

ServeGen (github alibaba/ServeGen, Apache-2.0; Xiang et al., "ServeGen: Workload
Characterization and Generation of Large Language Model Serving in Production",
arXiv 2505.09999) publishes, per client of a production model, 10-minute windows of
request rate and fitted inter-arrival distribution (`chunk-i-trace.csv`) and 6-hour
length distributions (`chunk-i-dataset.json`). This module is its generator,
`servegen/construct.py` `generate_workload` over a `ClientPool.span`, with the
aggregate rate of `servegen/utils.py` `get_scaled_rate_fn` (the clients' own summed
rate times `scale`):

- per window, each client with traffic gets `scale x` its recorded rate (its share of
  the scaled aggregate); `ceil(rate x window)` inter-arrival times are drawn from the
  window's Gamma(a=shape, scale) or Weibull(c=shape, scale) with one
  `numpy.random.RandomState(seed)` (through scipy.stats, as upstream), rescaled to sum
  to the window, and the arrivals strictly inside the window are kept: the last one
  lands on the window's end, so a window carries `ceil(rate x window) - 1` requests;
- each request's fields are drawn from the client's latest length distribution at or
  before the window (one uniform per request shared by every field, as upstream's
  `_sample_data_batch` does, so a request's input and output lengths sit at the same
  quantile of their distributions); multimodal requests then draw one token count per
  image, audio and video item;
- a client without a length file is left out, and a length window with an empty field
  is skipped, as `ClientPool._load_data` does.

Where this differs from upstream, and why (docs/planner.md says the same):
- clients are taken in id order (upstream: `os.listdir` order), so a seed gives the
  same trace on every machine;
- a window in which no client sent anything yields no request (upstream's
  `get_scaled_rate_fn` leaves such a window out of the rate function, and then
  `generate_workload` refuses the mismatch);
- a drawn length of 0 tokens is written as 1: a server takes at least one prompt token
  and returns at least one token.

PURE: the caller reads the files (`epp.planner.tracefile.load_servegen`) and passes
their text; the result is arrays, turned into Mooncake JSONL lines by `mooncake_lines`.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

WINDOW_S = 600  # ServeGen's trace windows
MEDIA = ("image", "audio", "video")
PATTERNS = ("Gamma", "Weibull")


class ServeGenError(ValueError):
    """ServeGen data that cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Window:
    """One client's 10-minute window; `pattern` is "" when it sent nothing."""

    start_s: int
    rate: float
    pattern: str
    shape: float
    scale: float


@dataclass(frozen=True)
class Client:
    cid: int
    windows: tuple[Window, ...]  # in time order
    lengths: tuple[tuple[int, dict[str, np.ndarray]], ...]  # (start_s, field -> CDF)

    def lengths_at(self, start_s: int) -> dict[str, np.ndarray] | None:
        """The latest length distribution at or before `start_s` (upstream's
        `_get_dataset_window`)."""
        best = None
        for ts, cdfs in self.lengths:
            if ts <= start_s:
                best = cdfs
        return best


@dataclass(frozen=True)
class Pool:
    clients: tuple[Client, ...]  # id order
    absent: tuple[int, ...]  # clients with a trace file and no length file (left out)
    end_s: int  # the end of the data (the last window's end)


@dataclass(frozen=True)
class Workload:
    """Requests in time order; `extra` holds per-request fields beyond the two
    lengths (reason_ratio; image/audio/video token lists), `None` where absent."""

    t_s: np.ndarray  # seconds from the span's start
    client: np.ndarray
    isl: np.ndarray
    osl: np.ndarray
    extra: dict[str, list]
    duration_s: float
    clients: int  # clients that sent anything in the span
    absent: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.t_s)

    def window_rates(self, window_s: float = WINDOW_S) -> np.ndarray:
        n = max(1, math.ceil(self.duration_s / window_s))
        counts = np.bincount((self.t_s // window_s).astype(np.int64), minlength=n)
        return counts[:n] / window_s


# -- reading --------------------------------------------------------------------------


def parse_trace_csv(text: str, name: str) -> tuple[Window, ...]:
    """`chunk-i-trace.csv`: `start_s,rate,cv,pattern,shape,scale`, no header."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.strip().split(",")
        if len(parts) != 6:
            raise ServeGenError(
                f"{name}:{number}: expected 6 fields start_s,rate,cv,pattern,shape,scale, "
                f"got {len(parts)}"
            )
        ts, rate, cv, pattern, shape, scale = parts
        try:
            start, r, a, b = int(ts), float(rate), float(shape), float(scale)
            float(cv)
        except ValueError:
            raise ServeGenError(
                f"{name}:{number}: start_s, rate, cv, shape and scale "
                f"must be numbers, got {line.strip()!r}"
            ) from None
        if pattern and pattern not in PATTERNS:
            raise ServeGenError(
                f"{name}:{number}: pattern must be Gamma, Weibull or empty, got {pattern!r}"
            )
        if not (r >= 0 and math.isfinite(r)):
            raise ServeGenError(f"{name}:{number}: rate must be a non-negative number")
        if pattern and r > 0 and not (a > 0 and b > 0):
            raise ServeGenError(f"{name}:{number}: {pattern} shape and scale must be positive")
        out.append(Window(start, r, pattern, a, b))
    if not out:
        raise ServeGenError(f"{name}: no windows")
    starts = [w.start_s for w in out]
    if starts != sorted(starts) or len(set(starts)) != len(starts):
        raise ServeGenError(f"{name}: window start times must increase")
    return tuple(out)


def parse_lengths(text: str, name: str) -> tuple[tuple[int, dict[str, np.ndarray]], ...]:
    """`chunk-i-dataset.json`: {start_s: {field: "{value: probability}"}} -> CDFs.

    Integer keys are token counts (a dense PDF over 0..max, as upstream builds it);
    other keys (reason_ratio's bins) keep their order. A window with an empty field is
    skipped, as upstream's loader does."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ServeGenError(f"{name}: not JSON ({e.msg})") from None
    if not isinstance(doc, dict):
        raise ServeGenError(f"{name}: expected an object of windows")
    out = []
    for ts, fields in doc.items():
        if not isinstance(fields, dict):
            raise ServeGenError(f"{name}: window {ts}: expected an object of fields")
        cdfs: dict[str, np.ndarray] = {}
        for field, spec in fields.items():
            try:
                pdf = ast.literal_eval(spec) if isinstance(spec, str) else spec
            except (ValueError, SyntaxError):
                raise ServeGenError(f"{name}: window {ts} field {field}: not a dict") from None
            if not isinstance(pdf, dict):
                raise ServeGenError(f"{name}: window {ts} field {field}: not a dict")
            if not pdf:
                cdfs = {}
                break
            if isinstance(next(iter(pdf)), int):
                dense = np.zeros(max(pdf) + 1)
                for k, p in pdf.items():
                    dense[k] = p
            else:
                dense = np.array(list(pdf.values()), dtype=float)
            cdfs[field] = np.cumsum(dense)
        if cdfs:
            out.append((int(ts), cdfs))
    out.sort(key=lambda x: x[0])
    return tuple(out)


def build_pool(traces: Mapping[int, str], lengths: Mapping[int, str], *, label: str = "") -> Pool:
    """Clients from their files' text (`traces`/`lengths` by client id)."""
    if not traces:
        raise ServeGenError(f"{label}no chunk-<i>-trace.csv files")
    orphan = sorted(set(lengths) - set(traces))
    if orphan:
        raise ServeGenError(f"{label}chunk-{orphan[0]}-dataset.json has no trace file")
    clients = []
    ends = set()
    for cid in sorted(lengths):
        windows = parse_trace_csv(traces[cid], f"{label}chunk-{cid}-trace.csv")
        dist = parse_lengths(lengths[cid], f"{label}chunk-{cid}-dataset.json")
        clients.append(Client(cid, windows, dist))
        ends.add(windows[-1].start_s + WINDOW_S)
    if not clients:
        raise ServeGenError(f"{label}no chunk-<i>-dataset.json files (no client has lengths)")
    absent = tuple(sorted(set(traces) - set(lengths)))
    return Pool(tuple(clients), absent, min(ends))


# -- generating -----------------------------------------------------------------------


def generate(pool: Pool, start_s: float, duration_s: float, scale: float, seed: int) -> Workload:
    """ServeGen's `generate_workload(pool.span(start, start + duration),
    get_scaled_rate_fn(view, scale), duration, seed)` (module doc)."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ServeGenError(f"scale must be a positive number, got {scale}")
    if not (duration_s > 0 and start_s >= 0):
        raise ServeGenError("the span must start at or after 0 and last more than 0 s")
    end_s = start_s + duration_s
    if end_s > pool.end_s:
        raise ServeGenError(
            f"the span ends at hour {end_s / 3600:g} but the data ends at hour "
            f"{pool.end_s / 3600:g}"
        )
    rng = np.random.RandomState(seed)
    groups: dict[float, list[tuple[Client, Window, float]]] = {}
    active = 0
    for c in pool.clients:
        mine = []
        for w in c.windows:
            lo, hi = max(w.start_s, start_s), min(w.start_s + WINDOW_S, end_s)
            if hi > lo:
                mine.append((c, w, hi - lo, lo - start_s))
        if any(w.pattern for _, w, _, _ in mine):
            active += 1
            for c_, w, size, at in mine:
                groups.setdefault(at, []).append((c_, w, size))
    times, owners, drawn = [], [], []
    for at in sorted(groups):
        group = [g for g in groups[at] if g[1].pattern]
        if sum(w.rate for _, w, _ in group) == 0:
            continue
        for c, w, size in group:
            t = _arrivals(w, scale * w.rate, size, rng)
            if len(t) == 0:
                continue
            cdfs = c.lengths_at(w.start_s)
            if cdfs is None:
                raise ServeGenError(
                    f"client {c.cid} sends requests at {w.start_s} s but has no length "
                    "distribution at or before it"
                )
            times.append(t + at)
            owners.append(np.full(len(t), c.cid, dtype=np.int64))
            drawn.append(_sample(cdfs, len(t), rng))
    return _assemble(times, owners, drawn, duration_s, active, pool.absent)


def _arrivals(w: Window, rate: float, size: float, rng: np.random.RandomState) -> np.ndarray:
    n = math.ceil(rate * size)
    if n == 0:
        return np.empty(0)
    if w.pattern == "Gamma":
        iats = stats.gamma.rvs(a=w.shape, loc=0, scale=w.scale, size=n, random_state=rng)
    else:
        iats = stats.weibull_min.rvs(c=w.shape, loc=0, scale=w.scale, size=n, random_state=rng)
    iats = np.atleast_1d(iats) * (size / np.sum(iats))
    # the rescaled sum is the window: the last arrival falls on its end, outside it
    return np.cumsum(iats)[:-1]


def _sample(cdfs: dict[str, np.ndarray], n: int, rng: np.random.RandomState) -> _Drawn:
    """Upstream's `_sample_data_batch`: one uniform per request for every field, then,
    for multimodal data, one token count per media item."""
    u = rng.random_sample(n)
    drawn = {f: np.searchsorted(cdf, u) for f, cdf in cdfs.items()}
    extra: dict[str, list] = {}
    if "reason_ratio" in drawn:
        bins = len(cdfs["reason_ratio"]) - 1
        extra["reason_ratio"] = (drawn["reason_ratio"] / bins if bins else 0.0 * u).tolist()
    if "image_count" not in cdfs:
        return _Drawn(drawn["input_tokens"], drawn["output_tokens"], extra)
    media: dict[str, list] = {f"{m}_tokens": [] for m in MEDIA}
    for i in range(n):
        for m in MEDIA:
            cdf = cdfs[f"{m}_tokens"]
            count = int(drawn[f"{m}_count"][i])
            media[f"{m}_tokens"].append(
                [int(np.searchsorted(cdf, rng.random_sample())) for _ in range(count)]
            )
    isl = drawn["text_tokens"] + np.array(
        [sum(map(sum, items)) for items in zip(*media.values(), strict=True)], dtype=np.int64
    )
    return _Drawn(isl, drawn["output_tokens"], extra | media)


@dataclass(frozen=True, slots=True)
class _Drawn:
    isl: np.ndarray
    osl: np.ndarray
    extra: dict[str, list]  # per-request values beyond the two lengths


def _assemble(
    times: list[np.ndarray],
    owners: list[np.ndarray],
    drawn: list[_Drawn],
    duration_s: float,
    active: int,
    absent: tuple[int, ...],
) -> Workload:
    if not times:
        empty = np.empty(0, dtype=np.int64)
        return Workload(np.empty(0), empty, empty, empty, {}, duration_s, active, absent)
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")  # upstream's list.sort: ties keep draw order
    extra: dict[str, list] = {}
    for name in dict.fromkeys(k for d in drawn for k in d.extra):
        column = [v for d in drawn for v in d.extra.get(name, [None] * len(d.isl))]
        extra[name] = [column[i] for i in order]
    return Workload(
        t_s=t[order],
        client=np.concatenate(owners)[order],
        isl=np.maximum(np.concatenate([d.isl for d in drawn])[order], 1),
        osl=np.maximum(np.concatenate([d.osl for d in drawn])[order], 1),
        extra=extra,
        duration_s=duration_s,
        clients=active,
        absent=absent,
    )


def mooncake_lines(w: Workload) -> Iterator[str]:
    """Mooncake JSONL (`timestamp` in ms; no prefix ids: ServeGen has no prompts), plus
    the fields the replay does not read: `client`, and `reason_ratio` or the
    image/audio/video token lists where the category has them."""
    ms = np.round(w.t_s * 1000.0, 3).tolist()
    cl, isl, osl = w.client.tolist(), w.isl.tolist(), w.osl.tolist()
    names: Sequence[str] = list(w.extra)
    for i in range(len(ms)):
        line = (
            f'{{"timestamp": {ms[i]}, "input_length": {isl[i]}, "output_length": {osl[i]}, '
            f'"hash_ids": [], "client": {cl[i]}'
        )
        for k in names:
            v = w.extra[k][i]
            line += f', "{k}": {json.dumps(v)}'
        yield line + "}"
