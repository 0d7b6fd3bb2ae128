"""The queue itself: priority bands, flows inside a band, capacity bounds. Pure: no
clock, no asyncio; the controller (controller.py) owns time and futures.

Shape (GIE `pkg/epp/flowcontrol/registry`, gie-epp.md §5.4):
- one **band** per priority; `pop` serves the highest-priority non-empty band (strict
  priority, work-conserving across bands);
- inside a band, one **flow** per fairness id (`x-gateway-inference-fairness-id`,
  default `default-flow` as upstream); `round-robin` fairness serves the flows in turn,
  one request each (GIE `round-robin-fairness-policy`; upstream walks sorted flow keys,
  here flows rotate in the order they became non-empty, which is the same fairness),
  `global-strict` serves the band as one FCFS queue (GIE's default policy);
- inside a flow, the band's ordering: first come first served (`fcfs-ordering-policy`,
  a FIFO), or earliest deadline first (a heap; ties FCFS): `edf-ordering-policy` orders
  by enqueue time + the request's effective TTL (GIE `ordering/edf`), and
  `slo-deadline-ordering-policy` by arrival + its `x-slo-ttft-ms` (GIE
  `ordering/slodeadline`); a request without one sorts after every request with one;
- capacity: requests and bytes (the raw body length, as upstream) per band and in total;
  `capacity_error` says which bound a new item would break.

An empty flow is deleted at once and an empty band holds nothing but its counters, so
memory is bounded by the queued items themselves (≤ the global request bound).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

DEFAULT_FLOW = "default-flow"  # upstream's fairness id when the header is absent
ROUND_ROBIN = "round-robin"
GLOBAL_STRICT = "global-strict"
FCFS = "fcfs"
EDF = "edf"  # deadline = enqueue + effective TTL
SLO_DEADLINE = "slo-deadline"  # deadline = arrival + x-slo-ttft-ms
ORDERINGS = (FCFS, EDF, SLO_DEADLINE)


@dataclass(frozen=True)
class BandLimits:
    """One band's bounds (0 = no bound of that kind) and its fairness policy."""

    max_requests: int = 0
    max_bytes: int = 0
    fairness: str = ROUND_ROBIN
    ordering: str = FCFS


@dataclass(eq=False, slots=True)
class Item:
    """One waiting request. `payload` is the controller's (its future); compared by identity."""

    priority: int
    flow: str
    size: int
    payload: Any = None
    labels: tuple[str, ...] = ()
    queued: bool = False
    # Deadlines for the deadline orderings (inf = none: after every item that has one).
    ttl_deadline: float = math.inf
    slo_deadline: float = math.inf
    seq: int = 0  # enqueue order, set by push (the FCFS tie-break)


class _Fifo:
    """A flow in FCFS order."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: deque[Item] = deque()

    def push(self, item: Item) -> None:
        self.items.append(item)

    def pop(self) -> Item:
        return self.items.popleft()

    def remove(self, item: Item) -> None:
        self.items.remove(item)  # O(flow length), bounded by the queue's capacity

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)


class _Deadlines:
    """A flow in earliest-deadline-first order (a heap; equal deadlines FCFS)."""

    __slots__ = ("heap", "key")

    def __init__(self, ordering: str) -> None:
        self.heap: list[tuple[float, int, Item]] = []
        self.key = ordering

    def push(self, item: Item) -> None:
        deadline = item.ttl_deadline if self.key == EDF else item.slo_deadline
        heapq.heappush(self.heap, (deadline, item.seq, item))

    def pop(self) -> Item:
        return heapq.heappop(self.heap)[2]

    def remove(self, item: Item) -> None:
        for i, entry in enumerate(self.heap):
            if entry[2] is item:
                self.heap[i] = self.heap[-1]
                self.heap.pop()
                heapq.heapify(self.heap)  # O(flow length), like the FIFO's remove
                return
        raise ValueError("item not in flow")

    def __len__(self) -> int:
        return len(self.heap)

    def __iter__(self) -> Iterator[Item]:
        return (entry[2] for entry in self.heap)


def _new_flow(ordering: str) -> _Fifo | _Deadlines:
    return _Fifo() if ordering == FCFS else _Deadlines(ordering)


@dataclass(slots=True)
class Band:
    priority: int
    limits: BandLimits
    flows: OrderedDict[str, _Fifo | _Deadlines] = field(default_factory=OrderedDict)
    requests: int = 0
    bytes: int = 0


class FlowQueue:
    """Bands by priority; `push`, `pop` (the next to dispatch), `remove` (TTL, disconnect)."""

    def __init__(
        self,
        max_requests: int,
        max_bytes: int,
        bands: dict[int, BandLimits] | None = None,
        default_band: BandLimits | None = None,
    ) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.configured = dict(bands or {})
        self.default_band = default_band or BandLimits()
        self._bands: dict[int, Band] = {}
        self._order: list[Band] = []  # highest priority first
        self.requests = 0
        self.bytes = 0
        self._seq = 0

    def __len__(self) -> int:
        return self.requests

    def band(self, priority: int) -> Band:
        """The band of `priority`, made from its configured limits (or the default band's)."""
        b = self._bands.get(priority)
        if b is None:
            b = Band(priority, self.configured.get(priority, self.default_band))
            self._bands[priority] = b
            self._order = sorted(self._bands.values(), key=lambda x: -x.priority)
        return b

    def capacity_error(self, priority: int, size: int) -> str | None:
        """Why an item of `size` bytes at `priority` may not join, or None if it may."""
        if self.requests + 1 > self.max_requests:
            return f"the flow-control queue holds its maximum of {self.max_requests} requests"
        if self.max_bytes and self.bytes + size > self.max_bytes:
            return (
                f"the flow-control queue holds {self.bytes} bytes; {size} more would pass "
                f"its maximum of {self.max_bytes}"
            )
        lim = self.configured.get(priority, self.default_band)
        b = self._bands.get(priority)
        n, held = (b.requests, b.bytes) if b is not None else (0, 0)
        if lim.max_requests and n + 1 > lim.max_requests:
            return f"priority band {priority} holds its maximum of {lim.max_requests} requests"
        if lim.max_bytes and held + size > lim.max_bytes:
            return (
                f"priority band {priority} holds {held} bytes; {size} more would pass its "
                f"maximum of {lim.max_bytes}"
            )
        return None

    def push(self, item: Item) -> None:
        """Append `item` to its flow (the caller checked `capacity_error`)."""
        b = self.band(item.priority)
        key = item.flow if b.limits.fairness == ROUND_ROBIN else DEFAULT_FLOW
        flow = b.flows.get(key)
        if flow is None:
            flow = b.flows[key] = _new_flow(b.limits.ordering)
        self._seq += 1
        item.seq = self._seq
        flow.push(item)
        item.queued = True
        b.requests += 1
        b.bytes += item.size
        self.requests += 1
        self.bytes += item.size

    def peek_band(self) -> Band | None:
        """The highest-priority band holding anything."""
        for b in self._order:
            if b.requests:
                return b
        return None

    def pop(self) -> Item | None:
        """The next item to dispatch: highest band; its next flow in turn; that flow's head."""
        b = self.peek_band()
        if b is None:
            return None
        key, flow = next(iter(b.flows.items()))
        item = flow.pop()
        if flow:
            b.flows.move_to_end(key)  # round robin: this flow waits for the others' turns
        else:
            del b.flows[key]
        self._forget(b, item)
        return item

    def remove(self, item: Item) -> bool:
        """Take a queued item out (expired, client gone); False if it was not queued."""
        if not item.queued:
            return False
        b = self._bands[item.priority]
        key = item.flow if b.limits.fairness == ROUND_ROBIN else DEFAULT_FLOW
        flow = b.flows[key]
        flow.remove(item)
        if not flow:
            del b.flows[key]
        self._forget(b, item)
        return True

    def _forget(self, b: Band, item: Item) -> None:
        item.queued = False
        b.requests -= 1
        b.bytes -= item.size
        self.requests -= 1
        self.bytes -= item.size

    def items(self) -> Iterator[Item]:
        """Every queued item (for the metrics collector, at scrape time)."""
        for b in self._order:
            for flow in b.flows.values():
                yield from flow
