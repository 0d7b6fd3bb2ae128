"""The planner file: Dynamo's flag names, strict keys, one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.config.errors import ConfigError
from epp.planner.core.config import describe_planner_file, load_planner_file
from epp.planner.core.removed import REMOVED
from epp.planner.core.types import Role


def test_defaults_are_the_seeds():
    cfg = load_planner_file("")
    assert cfg.planner.mode == "sla" and cfg.planner.pool == "aggregated"
    assert cfg.interval_s == 180.0  # SLA-v1 default for sla/dynamo
    assert cfg.planner.metric_pulling_interval == 1.0
    assert (cfg.budget.max_gpu_budget, cfg.budget.min_gpu_budget, cfg.budget.min_endpoint) == (
        8,
        1,
        1,
    )
    t = cfg.load
    assert (
        t.decode_kv_scale_up_threshold,
        t.decode_kv_scale_down_threshold,
        t.prefill_queue_scale_up_threshold,
        t.prefill_queue_scale_down_threshold,
    ) == (0.9, 0.5, 0.5, 0.2)  # seed 002, not LoadPlannerDefaults' 5.0
    assert (cfg.sla.ttft, cfg.sla.itl, cfg.sla.no_correction) == (500.0, 50.0, False)
    assert load_planner_file("mode: load").interval_s == 30.0  # seed 002's documented default


def test_a_flat_file_fills_every_group():
    cfg = load_planner_file(
        """
mode: dynamo
pool: disaggregated
adjustment-interval: 60
max-gpu-budget: 16
prefill-engine-num-gpu: 2
decode-kv-scale-up-threshold: 0.8
ttft: 200
itl: 10
no-correction: true
load-predictor: constant
sla-percentile: p99
startup-time: 300
""",
        "planner.yaml",
    )
    assert cfg.interval_s == 60.0 and cfg.roles == (Role.PREFILL, Role.DECODE)
    assert cfg.budget.gpus_per_replica()[Role.PREFILL] == 2
    assert cfg.load.decode_kv_scale_up_threshold == 0.8
    assert (cfg.sla.ttft, cfg.sla.itl, cfg.sla.no_correction) == (200.0, 10.0, True)
    assert cfg.predictor.load_predictor == "constant"
    assert cfg.beyond.sla_percentile == "p99" and cfg.beyond.startup_time == 300.0


def test_null_budget_means_no_bound():
    assert load_planner_file("max-gpu-budget: null").budget.max_gpu_budget is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "adjustment-intreval: 60",
            "adjustment-intreval: unknown setting; did you mean 'adjustment-interval'?",
        ),
        ("kalman-q-levl: 1", "did you mean 'kalman-q-level'?"),
        ("mode: fast", "mode: must be one of load, sla, dynamo; got 'fast'"),
        ("max-gpu-budget: lots", "max-gpu-budget: must be an integer, got 'lots'"),
        ("ttft: 0", "ttft: must be at least 0.001; got 0"),
        # disaggregated floors: 1 × (1 + 1) = 2 GPUs > budget 1
        (
            "pool: disaggregated\nmax-gpu-budget: 1",
            "max-gpu-budget: 1 is below min-endpoint 1 × (1 + 1 GPUs per prefill/decode "
            "replica) = 2",
        ),
        # aggregated, 4-GPU replicas, min-endpoint 2: 2 × 4 = 8 > 6
        (
            "decode-engine-num-gpu: 4\nmin-endpoint: 2\nmax-gpu-budget: 6",
            "max-gpu-budget: 6 is below min-endpoint 2 × (4 GPUs per aggregated replica) = 8",
        ),
        ("min-gpu-budget: 9", "min-gpu-budget: 9 is above max-gpu-budget 8"),
        (
            "decode-kv-scale-down-threshold: 0.95",
            "decode-kv-scale-down-threshold: 0.95 must be below decode-kv-scale-up-threshold 0.9",
        ),
        (
            "prefill-queue-scale-up-threshold: 0.1",
            "prefill-queue-scale-down-threshold: 0.2 must be below "
            "prefill-queue-scale-up-threshold 0.1",
        ),
        (
            "adjustment-interval: 5\nmetric-pulling-interval: 10",
            "metric-pulling-interval: 10.0 s is longer than the adjustment interval 5.0 s",
        ),
        (
            "aggregated-ttft: false",
            "aggregated-ttft: removed: the step model of an aggregated replica's TTFT",
        ),
        ("request-target: 0.99", "request-target: removed: sizing on the model's share"),
        ("- a list", "the planner file must be a map of settings"),
        ("mode: [", "line 1"),
    ],
)
def test_errors_are_one_line_naming_file_and_key(text, message):
    with pytest.raises(ConfigError) as e:
        load_planner_file(text, "p.yaml")
    text_of = str(e.value)
    assert text_of.startswith("p.yaml: ") and message in text_of and "\n" not in text_of


@pytest.mark.parametrize("key", sorted(REMOVED))
def test_a_removed_key_fails_with_one_line_saying_so(key):
    # whatever its value (even the old default), and among valid keys: the file was
    # written for an option that no longer exists
    with pytest.raises(ConfigError) as e:
        load_planner_file(f"mode: sla\nmax-gpu-budget: 8\n{key}: 1\n", "p.yaml")
    text = str(e.value)
    assert text.startswith(f"p.yaml: {key}: removed") and "\n" not in text
    assert "delete the key" in text
    assert key not in [row[0] for row in describe_planner_file()]


def test_describe_lists_every_key_once_with_a_doc():
    rows = describe_planner_file()
    keys = [r[0] for r in rows]
    assert len(keys) == len(set(keys))
    for key in (
        "adjustment-interval",
        "max-gpu-budget",
        "prefill-queue-scale-up-threshold",
        "ttft",
        "load-predictor",
        "queue-aware-prefill",
        "no-operation",
    ):
        assert key in keys
    assert all(doc for _, _, _, doc in rows)  # every setting says what it does


def test_docs_list_every_setting_with_its_default():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in doc.splitlines() if line.startswith("| `")}
    for key, _, default, _ in describe_planner_file():
        shown = "null" if default is None else default
        shown = str(shown).lower() if isinstance(shown, bool) else shown
        assert f"| `{shown}` |" in rows[f"`{key}`"], key


def test_a_sidecar_command_with_an_unknown_placeholder_is_one_clear_error():
    from epp.planner.core.config import check_live

    text = (
        "pool: disaggregated\nprefill-worker-command: epp sim --port {port}\n"
        "decode-worker-command: epp sim --port {port}\n"
        "decode-sidecar-command: epp sidecar --port {port} --decode-port {decode}\n"
    )
    cfg = load_planner_file(text, "p.yaml")
    with pytest.raises(ConfigError) as e:
        check_live(cfg)
    assert str(e.value).startswith("decode-sidecar-command:")
    assert "unknown placeholder 'decode'" in str(e.value) and "{decode_port}" in str(e.value)
