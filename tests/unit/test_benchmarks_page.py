"""docs/BENCHMARKS.md is what scripts/benchmarks_page.py makes of docs/data/results/: the
page cannot drift from the data, and every result names a command that is in the tree."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from bench import SUITES
from epp.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location(
    "benchmarks_page", ROOT / "scripts" / "benchmarks_page.py"
)
assert SPEC is not None and SPEC.loader is not None
page = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(page)


def results() -> list[dict]:
    return [page.load(p) for p in sorted(page.RESULTS.glob("*.json"))]


def test_regenerating_the_page_gives_no_diff():
    assert page.PAGE.read_text(encoding="utf-8") == page.render(), (
        "docs/BENCHMARKS.md is stale: run python scripts/benchmarks_page.py"
    )


def test_every_headline_is_on_the_page_in_order():
    suites = [r["suite"] for r in results()]
    assert set(page.ORDER) <= set(suites)
    text = page.PAGE.read_text(encoding="utf-8")
    headlines = [r for r in page.ordered(results()) if r["suite"] in page.ORDER]
    positions = [text.index(f"## {r['title']}") for r in headlines]
    assert positions == sorted(positions)


def test_every_other_result_is_one_supporting_row_linking_its_data():
    text = page.PAGE.read_text(encoding="utf-8")
    rest = text[text.index("## Supporting measurements") :]
    for r in results():
        if r["suite"] not in page.ORDER:
            assert f"## {r['title']}" not in text
            assert f"(data/results/{r['suite']}.json)" in rest, r["suite"]


def test_every_command_is_in_the_tree():
    for r in results():
        for path in re.findall(r"\b((?:bench|scripts)/[\w./-]+\.(?:py|sh))", r["command"]):
            assert (ROOT / path).exists(), f"{r['suite']}: {path} is not in the tree"
        for sub in re.findall(r"(?:^|\s|/)epp ([a-z-]+)", r["command"]):
            assert sub in COMMANDS, f"{r['suite']}: no `epp {sub}` command"
        for name in re.findall(r"\bepp bench ([a-z-]+)", r["command"]):
            assert name in SUITES, f"{r['suite']}: no `epp bench {name}` suite"
        for target in re.findall(r"\bmake ([a-z-]+)", r["command"]):
            makefile = (ROOT / "Makefile").read_text()
            assert re.search(rf"^{target}:", makefile, re.M), f"{r['suite']}: no make {target}"


def test_a_bad_result_file_is_refused_naming_the_field(tmp_path):
    good = json.loads((page.RESULTS / "load_test.json").read_text())
    (tmp_path / "load_test.json").write_text(json.dumps({**good, "rows": [["short"]]}))
    with pytest.raises(page.ResultError, match=r"rows\[0\] must be a list of 7 cells"):
        page.render(tmp_path)
    (tmp_path / "load_test.json").write_text(json.dumps({**good, "command": 3}))
    with pytest.raises(page.ResultError, match="field 'command' must be a str"):
        page.render(tmp_path)
    (tmp_path / "load_test.json").write_text(json.dumps({**good, "suite": "other"}))
    with pytest.raises(page.ResultError, match="must match the file name"):
        page.render(tmp_path)
