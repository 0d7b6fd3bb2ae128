"""The planner thread inside `epp serve`: observations in, decisions out, never on the
request loop.

    ticks ──► PlannerThread.tick(now)
                ├─ every metric-pulling-interval: roles.pool_samples(datastore) → window
                ├─ records (response sink) and admissions (director), handed over
                │  through one bounded queue, drained into the window
                └─ every adjustment-interval: window.close → policy.step(now, obs)
                        → recorder (JSONL + gauges)
                        → connectors.base.apply(connector, decision) on the server's
                          loop (run_coroutine_threadsafe); skipped with no-operation

Standalone (`epp planner --prometheus URL`), an `ObservationSource` replaces the
datastore and the hand-over queue: pool samples and the interval's request statistics
come from Prometheus (`source.py`); an interval it cannot read is not decided on.

Leader election (several EPP replicas, epp/election/): the thread asks its `elector`
at every tick. A follower samples the pool but never decides, starts or stops anything
(and never touches the connector's state); a connector that can mirror the leader's
pool (`follow()`, the local connector's statefile) is asked to. The first tick that finds
it leading takes over (`take_over`: the connector adopts what runs, brings each role up
to the floor); a leader that loses its lease stops acting at that tick.

The tick source is injected: `ClockTicks` sleeps on the wall clock (and can be woken
early), `ManualTicks` is advanced by hand in tests (no sleeps, no timing). The
datastore is read from this thread: its snapshot is a list of immutable views and its
pool a dict replaced whole on change, so reading it here never tears a request's view.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from epp.datastore import Datastore
from epp.election.base import AlwaysLeader, Elector
from epp.observability import PLANNER_DROPPED
from epp.planner.core.types import Decision, EndpointLoad, Policy
from epp.planner.core.window import IntervalWindow, PoolSample, RequestRecord
from epp.planner.live.connectors.base import Connector, apply
from epp.planner.live.record import DecisionRecorder
from epp.planner.live.source import SourceError
from epp.roles import pool_samples, role_of

log = logging.getLogger("epp.planner")

QUEUE_CAP = 100_000  # records + admissions per tick before the oldest news is dropped


class Ticks(Protocol):
    def next(self) -> float | None:
        """Block until the next tick; its time, or None when the thread must end."""

    def wake(self) -> None:
        """Tick now rather than at the next period (a request waits on an empty pool)."""

    def close(self) -> None: ...


class ObservationSource(Protocol):
    """Where a planner outside the EPP reads what the EPP would have told it
    (`source.PrometheusSource`); both raise `SourceError` when they cannot."""

    def pool_samples(self) -> list[PoolSample]: ...

    def requests(self, interval_s: float) -> dict[str, Any]:
        """Observation fields (arrivals, completions, Stats) over the last interval."""
        ...


class ClockTicks:
    """A tick every `period_s` on `clock`, or sooner when woken."""

    def __init__(self, period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.period_s = period_s
        self.clock = clock
        self._wake = threading.Event()
        self._closed = False

    def next(self) -> float | None:
        self._wake.wait(self.period_s)
        self._wake.clear()
        return None if self._closed else self.clock()

    def wake(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()


class ManualTicks:
    """Ticks a test gives by hand: `advance(now)` returns once that tick was handled."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self._q: queue.Queue[tuple[float, threading.Event] | None] = queue.Queue()
        self._ack: threading.Event | None = None
        self.timeout_s = timeout_s
        self.woken = 0

    def next(self) -> float | None:
        if self._ack is not None:
            self._ack.set()
            self._ack = None
        item = self._q.get()
        if item is None:
            return None
        now, self._ack = item
        return now

    def advance(self, now: float) -> None:
        done = threading.Event()
        self._q.put((now, done))
        if not done.wait(self.timeout_s):
            raise TimeoutError(f"the planner thread did not handle the tick at {now}")

    def wake(self) -> None:
        self.woken += 1

    def close(self) -> None:
        self._q.put(None)


class PlannerThread:
    def __init__(
        self,
        policy: Policy,
        datastore: Datastore,
        connector: Connector,
        loop: asyncio.AbstractEventLoop,
        ticks: Ticks,
        recorder: DecisionRecorder,
        *,
        no_operation: bool = False,
        queue_cap: int = QUEUE_CAP,
        source: ObservationSource | None = None,
        elector: Elector | None = None,
        floor: int = 0,
    ) -> None:
        self.policy = policy
        self.datastore = datastore
        self.connector = connector
        self.loop = loop
        self.ticks = ticks
        self.recorder = recorder
        self.no_operation = no_operation
        self.source = source
        self._news: queue.Queue[RequestRecord | int] = queue.Queue(queue_cap)
        self.dropped = 0
        self._dropped_logged = 0
        self.window: IntervalWindow | None = None
        self._next_sample = 0.0
        self._next_adjust = 0.0
        self.decisions: deque[Decision] = deque(maxlen=1000)  # the latest, for tests/debug
        self.last_apply: concurrent.futures.Future | None = None
        self._wakes: set[asyncio.Future] = set()
        self.elector: Elector = elector or AlwaysLeader()
        self.floor = floor  # min-endpoint: each role's replicas on taking over
        self.acting = False  # took over and still leads: the only state that acts
        self.took_over = False  # the connector was started (so it must be stopped)
        self._thread = threading.Thread(target=self._run, name="epp-planner", daemon=True)

    # ---- feeds, called on the request loop --------------------------------
    def on_record(self, record: RequestRecord) -> None:
        """The response observer's sink."""
        self._put(record)

    def on_admit(self, prompt_tokens: int) -> None:
        """The director's admission sink: one request routed with this prompt."""
        self._put(prompt_tokens)

    def _put(self, item: RequestRecord | int) -> None:
        try:
            self._news.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            PLANNER_DROPPED.inc()

    def wake_from_zero(self) -> None:
        """On the request loop: a request waits on a pool with no routable replica.
        Start one replica for every role that has none, at once (as Knative's activator
        makes its autoscaler leave zero without waiting for a window), and tick now so
        the next decision sees the waiting demand. With no-operation: log only."""
        if not self.acting:  # a follower: the leader's planner starts the replica
            self.ticks.wake()
            return
        for role, have in self.connector.replicas().items():
            if have.active > 0:
                continue
            if self.no_operation:
                log.info("planner: no-operation: would start a %s replica (scale from zero)", role)
                continue
            log.info("planner: a request waits and %s has no replica: starting one", role)
            task = asyncio.ensure_future(self.connector.set_replicas(role, 1))
            self._wakes.add(task)
            task.add_done_callback(self._wakes.discard)
        self.ticks.wake()

    # ---- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.ticks.close()
        self._thread.join(timeout=10)
        self.recorder.close()

    def _run(self) -> None:
        while (now := self.ticks.next()) is not None:
            try:
                self.tick(now)
            except Exception:  # a failing step must not end the planner
                log.exception("planner tick at %.3f failed", now)

    # ---- leadership --------------------------------------------------------
    async def take_over(self) -> None:
        """On the loop: adopt what already runs (a statefile, a cluster's state) and bring
        each role up to the floor; then this planner acts."""
        await self.connector.start()
        self.took_over = True
        unfollow = getattr(self.connector, "unfollow", None)
        if unfollow is not None:  # drop what it mirrored as a follower and did not adopt
            unfollow()
        for role, have in self.connector.replicas().items():
            if have.active < self.floor:
                await self.connector.set_replicas(role, self.floor)
        self.acting = True

    def _check_leader(self) -> bool:
        """Follow the election: take over when it is won, stop acting when it is lost."""
        leads = self.elector.is_leader()
        if leads and not self.acting:
            log.info("planner: %s leads: taking over", self.elector.identity)
            asyncio.run_coroutine_threadsafe(self.take_over(), self.loop).result(timeout=600)
        elif not leads and self.acting:
            log.warning("planner: %s no longer leads: not acting", self.elector.identity)
            self.acting = False
        if not self.acting:
            follow = getattr(self.connector, "follow", None)
            if follow is not None:  # mirror the leader's pool into this EPP's datastore
                self.loop.call_soon_threadsafe(follow)
        return self.acting

    # ---- one tick, on the planner thread ----------------------------------
    def tick(self, now: float) -> Decision | None:
        if self.window is None:
            self.window = IntervalWindow(now)
            self._next_sample = now
            self._next_adjust = now + self.policy.interval_s
        leads = self._check_leader()
        self._drain_news()
        if now >= self._next_sample:
            self.window.sample(self._pool_samples())
            self._next_sample = now + self.policy.sample_interval_s
        if now < self._next_adjust:
            return None
        self._next_adjust = now + self.policy.interval_s
        if not leads:  # a follower keeps one interval of history for when it takes over
            self.window = IntervalWindow(now)
            return None
        refresh = getattr(self.connector, "refresh", None)
        if refresh is not None:  # a connector that reads its state remotely (Kubernetes)
            asyncio.run_coroutine_threadsafe(refresh(), self.loop).result(timeout=30)
        ready = self.connector.ready_names()
        endpoints = [
            EndpointLoad(s.name, role_of(s.endpoint), s.inflight_requests, s.inflight_tokens)
            for s in self.datastore.snapshot()
            if s.name in ready
        ]
        obs = self.window.close(now, self.connector.replicas(), endpoints)
        if self.source is not None:
            try:
                obs = dataclasses.replace(obs, **self.source.requests(self.policy.interval_s))
            except SourceError as e:
                log.warning("planner: no decision for this interval: %s", e)
                return None
        decision = self.policy.step(now, obs)
        self.decisions.append(decision)
        self.recorder.record(decision, obs)
        log.info("planner decision: %s", decision.reason)
        if decision.diagnostics.get("startup_bound"):
            log.warning(
                "planner: the SLA is missed while replicas start (start-up bound): %s",
                decision.reason,
            )
        if not self.no_operation:
            self.last_apply = asyncio.run_coroutine_threadsafe(
                apply(self.connector, decision), self.loop
            )
        return decision

    def _pool_samples(self) -> list[PoolSample]:
        if self.source is None:
            return pool_samples(self.datastore.snapshot())
        try:
            return self.source.pool_samples()
        except SourceError as e:
            log.warning("planner: pool load not sampled: %s", e)
            return []

    def _drain_news(self) -> None:
        assert self.window is not None
        if self.dropped > self._dropped_logged:
            log.warning(
                "planner: %d admissions/finished requests dropped so far (hand-over queue "
                "full); the interval's demand reads low",
                self.dropped,
            )
            self._dropped_logged = self.dropped
        while True:
            try:
                item = self._news.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, int):
                self.window.admit(item)
            else:
                self.window.complete(item)


# ---- wiring into `epp serve` ------------------------------------------------


def build_live_planner(
    config: object,
    profile: object,
    datastore: Datastore,
    loop: asyncio.AbstractEventLoop,
    *,
    pool: str = "default",
    ticks: Ticks | None = None,
    source: ObservationSource | None = None,
    elector: Elector | None = None,
) -> PlannerThread:
    """The policy the planner file's `mode` picks, the connector its `environment`
    picks (local, virtual or kubernetes), the recorder its `log-dir` names, behind one thread."""
    from epp.planner.core.config import PlannerConfig
    from epp.planner.core.planner import policy_for_mode
    from epp.planner.live.connectors.local import LocalConnector

    assert isinstance(config, PlannerConfig)
    policy = policy_for_mode(config, profile)  # type: ignore[arg-type]
    connector: Connector
    if config.live.environment == "virtual":
        from epp.planner.live.connectors.virtual import VirtualConnector

        connector = VirtualConnector(config.roles, config.live.virtual_address)
    elif config.live.environment == "kubernetes":
        from epp.datalayer.k8s_discovery import load_api_client
        from epp.planner.live.connectors.kubernetes import KubernetesConnector, Workload

        live = config.live
        connector = KubernetesConnector(
            load_api_client(None),
            live.kubernetes_namespace,
            {r: Workload.parse(live.workload_for(r) or "") for r in config.roles},
            rollout_timeout_s=live.rollout_timeout,
        )
    else:
        connector = LocalConnector(datastore, config.live, config.roles, pool=pool)
    recorder = DecisionRecorder(config.live.log_dir, config.budget.gpus_per_replica())
    return PlannerThread(
        policy,
        datastore,
        connector,
        loop,
        ticks or ClockTicks(policy.sample_interval_s),
        recorder,
        no_operation=config.planner.no_operation,
        source=source,
        elector=elector,
        floor=config.budget.min_endpoint,
    )


async def start_live_planner(planner: PlannerThread, floor: int) -> None:
    """If this EPP leads (always, without an election): adopt what the statefile names,
    bring each role up to `floor` (min-endpoint). Then start the thread; a follower's
    thread takes over when it wins the election."""
    planner.floor = floor
    if planner.elector.is_leader():
        await planner.take_over()
    planner.start()


async def stop_live_planner(planner: PlannerThread) -> None:
    """End the thread, then stop every replica the connector owns. A follower never
    started its connector: it stops nothing (the leader's replicas and statefile stay)."""
    await asyncio.to_thread(planner.stop)
    if planner.took_over:
        await planner.connector.stop()
