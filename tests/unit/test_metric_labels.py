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
