"""The planner file as `epp serve --planner` and `epp planner` load it: parsed, checked
for a live run, and with its profile when its mode needs one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from epp.config.errors import ConfigError
from epp.planner.core.config import PlannerConfig, check_live, load_planner_file

if TYPE_CHECKING:
    from epp.planner.core.perf import Profile


def planner_statefile(planner: PlannerConfig, pool: str) -> Path:
    """Where the local connector keeps its statefile (connectors/local.py)."""
    return Path(os.path.expanduser(planner.live.statefile.format(pool=pool)))


def load_planner(path: str) -> tuple[PlannerConfig, Profile | None]:
    """The planner file and, for the SLA modes, its profile; any fault is a ConfigError
    naming the file and the key, so `epp serve` stops before opening a port."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("", f"cannot read the planner file: {e.strerror}", path) from None
    cfg = load_planner_file(text, path)
    try:
        check_live(cfg)
    except ConfigError as e:
        raise e.in_file(path) from None
    if cfg.planner.mode == "load":
        return cfg, None
    # Imported here: the profile reader pulls in scipy.interpolate (~2 s of CPU), which
    # only the SLA modes need; every other start (and restart) of `epp serve` skips it.
    from epp.planner.core.perf import ProfileError, load_profile

    try:
        return cfg, load_profile(cfg.planner.profile_results_dir)
    except (ProfileError, OSError) as e:
        raise ConfigError(
            "profile-results-dir",
            f"mode {cfg.planner.mode} needs profile data: {e} (run epp profile, or use mode: load)",
            path,
        ) from None
