"""The replay's routing: the EPP's own `Director` and scheduler over the simulated pool, so
cache hits and queueing in a replay are the ones `epp serve` with the same config would
produce (config/default.yaml, "sticky until saturated", unless the replay names another).

What the EPP would know, it is told, in virtual time:

- membership: a replica joins the datastore when it becomes ready (a pod joins the
  InferencePool when it passes readiness), is marked draining when the planner drains
  it (never picked again, its requests still counted) and leaves when it is gone (the
  prefix index then forgets it);
- metrics: every `scrape_s` (the EPP's `--refresh-metrics-interval`, 50 ms) each ready
  replica's waiting and running requests and KV use, read from its engine at the first
  arrival after the tick (a value is written only when it changed: an unchanged scrape
  leaves the snapshot as it is);
- in flight: the director's own accounting, as on the response path: a request's prompt
  stops counting at its first token, the rest at its last;
- the prompt: token ids whose 16-token blocks are equal exactly where the trace says two
  prompts share a prefix (Mooncake's 512-token `hash_ids`; none shared without them), so
  the prefix index learns and matches what the servers' caches hold.

The request is built once per arrival with its ids as an `array` (the index hashes the
bytes; no list of ints per token), and the snapshot is the datastore's incremental one:
the cheapest way found that still runs every plugin of the config on every request.

Pure: no clock, no I/O; the pool moves time forward (`now`).
"""

from __future__ import annotations

import copy
import heapq
import math
import random
from array import array
from collections.abc import Sequence

import yaml

from epp.composition import install_plugins
from epp.config.errors import ConfigError
from epp.config.loader import LoadedConfig, build, load_config_text
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from epp.director import Director, RoutingDecision
from epp.planner.offline import unique_prompts as unique_prompts_path
from epp.request import InferenceRequest
from epp.scheduling.registry import Handle

MODEL = "replay"
SCRAPE_S = 0.05  # the EPP's default --refresh-metrics-interval (GIE's 50 ms)
_TAIL = 1 << 31  # first token of a prompt's part past its shared blocks: never a block's


# config text -> its parsed YAML: a day's oracle sizes every interval with a few short
# replays, each with a fresh scheduler, and parsing the YAML and scanning the installed
# packages' entry points for plugins each time cost ~10 ms a replay
_PARSED: dict[str, object] = {}


def load(config_text: str, source: str, seed: int, clock) -> LoadedConfig:
    """A fresh scheduler of `config_text` (every replay starts with an empty prefix
    index and a seeded tie-break)."""
    handle = Handle(rng=random.Random(seed), clock=clock)
    data = _PARSED.get(config_text)
    if data is None:
        install_plugins()
        loaded = load_config_text(config_text, source, handle)  # its errors, as epp serve's
        _PARSED[config_text] = yaml.safe_load(config_text)
        return loaded
    try:
        return build(copy.deepcopy(data), handle, source)
    except ConfigError as e:
        raise e.in_file(source) from None


class EppRouter:
    """The director, its datastore, and the requests it holds (module doc)."""

    def __init__(
        self,
        config_text: str,
        source: str,
        *,
        seed: int,
        block_tokens: int,
        cache_block_size: int,
        cache_num_blocks: int,
        scrape_s: float = SCRAPE_S,
        unique_prompts: bool = False,
    ) -> None:
        self.now = 0.0
        clock = self._clock
        self.datastore = Datastore(staleness=math.inf, clock=clock, require_metrics=False)
        handle_config = self.config = load(config_text, source, seed, clock)
        handle = handle_config.handle
        handle.pool = self.datastore.endpoints  # type: ignore[misc]
        handle.on_pool_change = self.datastore.on_change  # type: ignore[misc]
        self.director = Director(
            self.datastore,
            handle_config.scheduler,
            handle_config.pre_request,
            rng=random.Random(seed),
        )
        # plugin durations in virtual time mean nothing and nobody reads them
        self.director.stop_timing()
        # what `epp serve` calls after a membership change (the prefix indexes' PoolWatch)
        self._prunes = [
            p.prune for p in handle_config.plugins.values() if callable(getattr(p, "prune", None))
        ]
        # no prompt shares a block with another: the prefix index only counts
        # (`unique_prompts`), when the config allows it
        self.unique_prompts = unique_prompts and unique_prompts_path.install(handle_config)
        self.block_tokens = block_tokens
        self.geometry = (cache_block_size, cache_num_blocks)
        self.scrape_s = scrape_s
        self._next_scrape = 0.0
        self._seen: dict[str, tuple[int, int, float]] = {}  # last metrics written
        self._decisions: dict[int, RoutingDecision] = {}
        self._prefill: dict[str, list[tuple[int, object]]] = {}  # name -> (rid, engine req)
        self._ends: list[tuple[float, int]] = []  # (finish, rid): released at finish
        self._ip = 0

    def _clock(self) -> float:
        return self.now

    # -- membership ---------------------------------------------------------------------

    def join(self, name: str) -> None:
        self._ip += 1
        a, b = divmod(self._ip, 250)
        self.datastore.add_endpoint(Endpoint(name, f"10.{a // 250}.{a % 250}.{b + 1}", 8000))
        self._seen.pop(name, None)
        self._next_scrape = self.now  # a new endpoint is scraped at once

    def drain(self, name: str) -> None:
        self.datastore.set_draining(name)

    def leave(self, name: str) -> None:
        """A released replica leaves the pool, and the prefix index forgets it (as the
        indexes' pool watch does in `epp serve`): a day of scaling adds hundreds."""
        self.datastore.remove_endpoint(name)
        self._seen.pop(name, None)
        self._prefill.pop(name, None)
        for prune in self._prunes:
            prune()

    # -- time ---------------------------------------------------------------------------

    def finished(self, rid: int, finish: float) -> None:
        heapq.heappush(self._ends, (finish, rid))

    def settle(self, now: float, loads) -> None:
        """Tell the director what passed by `now`: first tokens, ends, a scrape.
        `loads()` yields (name, waiting, running, kv use) of the ready replicas."""
        self.now = now
        director = self.director
        for name, pending in self._prefill.items():
            if not pending:
                continue
            keep = []
            for rid, req in pending:
                first = req.first_token_at  # type: ignore[attr-defined]
                if first is not None and first <= now:
                    director.first_token(self._decisions[rid])
                else:
                    keep.append((rid, req))
            if len(keep) != len(pending):
                self._prefill[name] = keep
        ends = self._ends
        while ends and ends[0][0] <= now:
            _, rid = heapq.heappop(ends)
            director.release(self._decisions.pop(rid))
        if now >= self._next_scrape:
            self._scrape(loads())
            self._next_scrape = (math.floor(now / self.scrape_s) + 1) * self.scrape_s

    def _scrape(self, loads) -> None:
        size, blocks = self.geometry
        seen, update = self._seen, self.datastore.update_metrics
        for name, waiting, running, kv in loads:
            key = (waiting, running, kv)
            if seen.get(name) != key:
                seen[name] = key
                update(
                    name,
                    EndpointMetrics(
                        waiting_queue_size=waiting,
                        running_requests=running,
                        kv_cache_usage=kv,
                        cache_block_size=size,
                        cache_num_blocks=blocks,
                        update_time=self.now,
                    ),
                )

    # -- routing ------------------------------------------------------------------------

    def pick(self, rid: int, isl: int, osl: int, hash_ids: Sequence[int]) -> str:
        """The director's pick for the request (its hold taken, its prefix recorded)."""
        if self.unique_prompts and hash_ids:
            raise ValueError(f"request {rid} shares prefix blocks in a unique-prompt replay")
        request = InferenceRequest(
            request_id=str(rid),
            model=MODEL,
            target_model=MODEL,
            prompt_token_ids=self._prompt(rid, isl, hash_ids),  # type: ignore[arg-type]
            prompt_token_count=isl,
            max_tokens=osl,
        )
        decision = self.director.route(request, None)
        self._decisions[rid] = decision
        return decision.result.primary.targets[0].endpoint.name  # type: ignore[union-attr]

    def routed(self, rid: int, name: str, engine_request: object) -> None:
        """The engine's request for `rid`: its first token releases the prompt."""
        self._prefill.setdefault(name, []).append((rid, engine_request))

    def _prompt(self, rid: int, isl: int, hash_ids: Sequence[int]) -> array:
        """Ids equal block for block where the trace says the prompts are: the first
        token of each shared `block_tokens` block names it (the rest are zeros, chained
        after it), the first token past them names the request."""
        ids = array("I", bytes(4 * isl))
        bt = self.block_tokens
        covered = 0
        for j, h in enumerate(hash_ids):
            p = j * bt
            if p >= isl:
                break
            ids[p] = (h + 1) % _TAIL
            covered = p + bt
        if covered < isl:
            ids[covered] = _TAIL + rid % _TAIL
        return ids
