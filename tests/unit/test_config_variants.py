"""epp.config.variants: `config/slo.yaml` without its predictor, the anchor's baseline
("the same stack without the predictor") in both SLO benchmarks."""

import random
from pathlib import Path

import yaml

from epp.composition import install_plugins
from epp.config.loader import load_config_file
from epp.config.variants import PREDICTOR_TYPES, without_predictor, write_without_predictor
from epp.scheduling.registry import Handle

ROOT = Path(__file__).resolve().parents[2]


def test_slo_yaml_without_predictor_loads_with_everything_else_kept(tmp_path):
    source = ROOT / "config" / "slo.yaml"
    original = yaml.safe_load(source.read_text())
    path = write_without_predictor(source, tmp_path)
    derived = yaml.safe_load(path.read_text())
    kept = [p["type"] for p in original["plugins"] if p["type"] not in PREDICTOR_TYPES]
    assert [p["type"] for p in derived["plugins"]] == kept
    assert len(kept) < len(original["plugins"])  # slo.yaml has the predictor to remove
    refs = [r["pluginRef"] for r in derived["schedulingProfiles"][0]["plugins"]]
    assert not set(refs) & PREDICTOR_TYPES
    # the EPP's own loader accepts it, and builds no predictor
    loaded = load_config_file(path, Handle(rng=random.Random(0)), install_plugins())
    assert not [p for p in loaded.plugins.values() if p.name in PREDICTOR_TYPES]
    assert set(loaded.plugins) >= {"token-load-scorer", "prefix-cache-scorer"}


def test_named_instances_are_dropped_by_name_and_their_weights_with_them():
    config = {
        "plugins": [
            {"type": "latency-scorer", "name": "lat"},
            {"type": "queue-scorer", "name": "q"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "p",
                "plugins": [
                    {"pluginRef": "lat", "weight": 3},
                    {"pluginRef": "q", "weight": 2},
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
    }
    out = without_predictor(config)
    assert out["plugins"] == config["plugins"][1:]
    assert out["schedulingProfiles"][0]["plugins"] == [
        {"pluginRef": "q", "weight": 2},
        {"pluginRef": "max-score-picker"},
    ]
    assert len(config["plugins"]) == 3  # the input is not changed
