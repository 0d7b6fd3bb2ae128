"""bench/results.py is the one writer of a headline's JSON: the schema's fields, the
machine's load as the suite measured it, and any raw figures kept after them."""

from __future__ import annotations

import json

import pytest

from bench.results import ROOT, Result, ResultError, check, command_line, load_span


def test_measured_writes_the_schema_with_the_load_and_extra_figures(tmp_path):
    r = Result.measured(
        "overload_eviction", "t", "python bench/overload.py", ["a", "b"], [[1, 2]],
        load=load_span((3.0, 0.0, 0.0), (4.5, 0.0, 0.0)), capacity_rps=[1.5],
    )  # fmt: skip
    path = r.write(tmp_path / "overload_eviction.json")
    data = json.loads(path.read_text())
    check(data, path.name)
    assert data["machine"].endswith("load average 3.0 before, 4.5 after")
    assert data["capacity_rps"] == [1.5]
    assert list(data)[:9] == ["suite", "title", "command", "git_commit", "machine", "date",
                              "columns", "rows", "notes"]  # fmt: skip
    assert r.write(tmp_path) == tmp_path / "overload_eviction.json"


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ResultError, match=r"rows\[0\] must be a list of 2 cells"):
        Result.measured("s", "t", "c", ["a", "b"], [[1]]).to_json()


def test_the_command_names_the_script_in_the_tree():
    argv = [str(ROOT / "bench" / "overload.py"), "--repeats", "3"]
    assert command_line(argv) == "python bench/overload.py --repeats 3"
