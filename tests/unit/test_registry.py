"""The plugin registry: the framework knows no plugin, the composition root fills it,
out-of-tree plugins arrive through the `epp.plugins` entry-point group, and a failed
import leaves the registry as it was."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import plugins
from epp.config.errors import ConfigError
from epp.config.loader import load_config_text
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import PluginImportError, Registry, plugin_classes, register

ROOT = Path(__file__).resolve().parents[2]

TINY_PLUGIN = """
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import register


@register("tiny-scorer")
class TinyScorer(Plugin):
    def __init__(self, name, params, handle):
        self.name = name

    def score(self, state, request, endpoints):
        return [0.5] * len(endpoints)
"""


def _write_dist(root: Path, module: str, source: str, entry: str) -> None:
    """A package on disk as pip would install it: the module and its dist-info with a
    real `entry_points.txt`, so importlib.metadata finds it on sys.path."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[epp.plugins]\n{entry}\n")


def test_framework_modules_import_no_plugin():
    code = (
        "import sys, epp.config.loader, epp.scheduling.registry, epp.director, "
        "epp.extproc.server; print(sorted(m for m in sys.modules if m.split('.')[0] == 'plugins'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_module_with_a_registered_class_is_in_the_builtin_list():
    defining = []
    for info in pkgutil.walk_packages(plugins.__path__, "plugins."):
        if plugin_classes(importlib.import_module(info.name)):
            defining.append(info.name)
    assert sorted(defining) == sorted(plugins.BUILTIN_MODULES)


def test_an_empty_registry_names_the_missing_step():
    with pytest.raises(ConfigError, match="install_plugins"):
        load_config_text("plugins:\n- type: queue-scorer\n", registry=Registry())


def test_registering_the_builtins_twice_is_harmless():
    reg = Registry()
    plugins.register_builtins(reg)
    before = reg.all_names()
    plugins.register_builtins(reg)
    assert reg.all_names() == before
    assert "queue-scorer" in before  # an upstream alias, resolved
    assert reg.canonical("queue-scorer") == "queue-depth-scorer"


def test_a_type_taken_twice_is_refused():
    reg = Registry()
    plugins.register_builtins(reg)

    @register("queue-depth-scorer")
    class Clash:
        pass

    with pytest.raises(ValueError, match="'queue-depth-scorer' registered twice"):
        reg.add(Clash)


def test_entry_point_plugin_registers_and_loads_in_a_config(tmp_path, monkeypatch):
    _write_dist(tmp_path, "tiny_epp_plugin", TINY_PLUGIN, "tiny = tiny_epp_plugin")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry()
    assert reg.add_entry_points() == ["tiny"]
    spec = reg.lookup("tiny-scorer")
    assert spec is not None and spec.cls.__name__ == "TinyScorer"
    config = load_config_text(
        "plugins:\n- type: tiny-scorer\n- type: max-score-picker\n",
        registry=_with_builtins(reg),
    )
    assert config.plugins["tiny-scorer"].type_name == "tiny-scorer"


def test_epp_plugins_lists_an_installed_entry_point(tmp_path):
    _write_dist(tmp_path, "tiny_epp_plugin", TINY_PLUGIN, "tiny = tiny_epp_plugin:TinyScorer")
    env_path = f"{tmp_path}:{ROOT}"
    out = subprocess.run(
        [sys.executable, "-m", "epp.cli", "plugins", "tiny-scorer"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("tiny-scorer  [tiny_epp_plugin.py]")


def test_a_broken_entry_point_is_one_line_and_exit_2_for_the_cli(tmp_path):
    _write_dist(tmp_path, "bad_epp_plugin", "import no_such_module_here\n", "bad = bad_epp_plugin")
    out = subprocess.run(
        [sys.executable, "-m", "epp.cli", "plugins"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "entry point 'bad'" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_failed_import_leaves_the_registry_unchanged_and_retryable(tmp_path, monkeypatch):
    flaky = tmp_path / "flaky_epp_plugin.py"
    flaky.write_text("raise RuntimeError('missing dependency')\n" + TINY_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry()
    modules = [*plugins.BUILTIN_MODULES, "flaky_epp_plugin"]
    with pytest.raises(PluginImportError, match=r"'flaky_epp_plugin'.*missing dependency"):
        reg.add_modules(modules)
    assert reg.all_types() == []  # nothing half-registered: the built-ins are not in either
    flaky.write_text(TINY_PLUGIN)  # the cause is fixed; the same call now succeeds
    importlib.invalidate_caches()
    reg.add_modules(modules)
    assert reg.lookup("tiny-scorer") is not None
    assert reg.lookup("max-score-picker") is not None


def test_a_broken_entry_point_names_itself_and_registers_nothing(tmp_path, monkeypatch):
    _write_dist(tmp_path, "good_epp_plugin", TINY_PLUGIN, "good = good_epp_plugin")
    bad = tmp_path / "bad"
    bad.mkdir()
    _write_dist(bad, "bad_epp_plugin", "import no_such_module_here\n", "bad = bad_epp_plugin")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(bad))
    reg = Registry()
    with pytest.raises(PluginImportError, match=r"entry point 'bad' .*no_such_module_here"):
        reg.add_entry_points()
    assert reg.all_types() == []


def _with_builtins(reg: Registry) -> Registry:
    plugins.register_builtins(reg)
    return reg


def test_a_producer_without_a_declared_key_is_refused():
    @register("keyless-producer")
    class Keyless(Plugin):
        def __init__(self, name, params, handle):
            super().__init__(name)

        def produce(self, state, request, endpoints):
            return {}

    reg = _with_builtins(Registry())
    reg.add(Keyless)
    with pytest.raises(ConfigError, match="declares no `produces` key") as e:
        load_config_text("plugins:\n- type: keyless-producer\n", registry=reg)
    assert e.value.path == "plugins[0]"
