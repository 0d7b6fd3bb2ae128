"""docs/plugins.md must name every registered plugin type and alias (no drift)."""

from pathlib import Path

from epp.plugins_cli import render
from epp.scheduling.registry import PLUGIN_TYPES

DOC = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()


def test_every_plugin_type_and_alias_is_documented():
    missing = [n for n in PLUGIN_TYPES.all_names() if f"`{n}`" not in DOC]
    assert missing == []


def test_plugin_list_shows_parameters_and_aliases():
    text = render("max-score-picker")
    assert "maxNumOfEndpoints: an integer = 1" in text
    assert "(upstream: queue-scorer)" in render("queue-scorer")
    assert "not implemented yet" in render("load-aware-scorer")
