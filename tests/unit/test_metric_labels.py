"""Model names as metric labels: only names the pool serves, each cut to a bounded length."""

from epp.datastore import Datastore, Endpoint, EndpointMetrics
from epp.observability import MAX_LABEL_CHARS, OTHER_MODEL, model_label


def test_unserved_names_share_one_label_and_served_ones_are_capped():
    long_name = "m" * (MAX_LABEL_CHARS + 50)
    served = {"llama", long_name}
    assert model_label("llama", served) == "llama"
    assert model_label("anything-else", served) == OTHER_MODEL
    assert model_label(long_name, served) == "m" * MAX_LABEL_CHARS
    assert model_label("", served) == ""  # a request without a model (GET)


def test_served_models_follow_v1_models_and_running_adapters():
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 1), Endpoint("b", "10.0.0.2", 1)])
    assert ds.served_models() == frozenset()  # nothing reported yet: no name is served
    ds.set_models("a", ["base"])
    assert ds.served_models() == {"base"}
    ds.update_metrics("b", EndpointMetrics(active_models=frozenset({"lora-1"})))
    assert ds.served_models() == {"base", "lora-1"}
    ds.set_endpoints([Endpoint("b", "10.0.0.2", 1)])  # a leaves the pool
    assert ds.served_models() == {"lora-1"}


def test_adder_updates_a_child_as_inc_and_dec_do():
    """`adder(child)(x)` (the director's one-call update) moves the exposed value as
    `child.inc(x)` / `child.dec(-x)` would; an object without prometheus_client's value
    gets its own `inc`."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    from epp.observability import adder

    def exposed(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode()
        return [
            ln for ln in text.splitlines() if ln and not ln.startswith("#") and "_created" not in ln
        ]

    fast, slow = CollectorRegistry(), CollectorRegistry()
    for registry, use_adder in ((fast, True), (slow, False)):
        counter = Counter("reqs", "r", ["model"], registry=registry).labels("m")
        gauge = Gauge("running", "r", ["model"], registry=registry).labels("m")
        for _ in range(3):
            if use_adder:
                adder(counter)(1)
                adder(gauge)(1)
            else:
                counter.inc()
                gauge.inc()
        adder(gauge)(-1) if use_adder else gauge.dec()
    assert exposed(fast) == exposed(slow) == ['reqs_total{model="m"} 3.0', 'running{model="m"} 2.0']

    class Plain:
        def __init__(self) -> None:
            self.total = 0.0

        def inc(self, amount: float = 1) -> None:
            self.total += amount

    plain = Plain()
    adder(plain)(2)
    assert plain.total == 2
