"""The build's commit, for the `commit` label of `inference_extension_info`.

GIE stamps the commit into the binary at build time (`-ldflags`); a Python package has no
link step, so the EPP looks in order at: `$EPP_COMMIT` (set by whoever builds an image or
a wheel from a checkout, e.g. `EPP_COMMIT=$(git rev-parse HEAD)`), then the git checkout
the package was imported from (an editable or source install), else `unknown`. Read once
when `epp serve` starts, never on the request path.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

COMMIT_ENV = "EPP_COMMIT"
UNKNOWN = "unknown"
_HEX = re.compile(r"[0-9a-f]{7,40}")


def build_commit(source: Path | None = None) -> str:
    """The commit as 40 (or, from $EPP_COMMIT, 7-40) lowercase hex digits, or `unknown`.

    A malformed $EPP_COMMIT is ignored rather than trusted: the label must stay bounded."""
    env = os.environ.get(COMMIT_ENV, "").strip().lower()
    if _HEX.fullmatch(env):
        return env
    root = source or Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return UNKNOWN
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and _HEX.fullmatch(commit) else UNKNOWN
