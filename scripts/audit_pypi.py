"""Known vulnerabilities in the installed Python distributions, from PyPI's own records.

Why not pip-audit alone: it asks PyPI for each release's record
(`/pypi/<name>/<version>/json`), and where that path is not reachable (this workplace's
network serves a project's record but answers 404 for a release's) it can audit nothing;
with `--strict` it fails, without it it prints "No known vulnerabilities found" having
looked at nothing. PyPI's project record (`/pypi/<name>/json`) carries the same
`vulnerabilities` list (OSV's advisories, as PyPI publishes them) for the project's newest
release, so a distribution installed at its newest release is audited from it. A release
record that is reachable is always preferred: it is exact for any version.

Every distribution ends in one of three states, printed when it is not clean:
  vulnerable  an advisory (not withdrawn) names the installed version: exit 1
  unaudited   neither record applies (an older release whose own record is unreachable,
              or no record at all): exit 2 with --strict, reported either way
  clean       audited, no advisory

    python scripts/audit_pypi.py [--strict] [--index-url https://pypi.org]

Standard library only, so it runs in any environment whose packages it audits.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

DEFAULT_INDEX = "https://pypi.org"
VULNERABLE, UNAUDITED, CLEAN = "vulnerable", "unaudited", "clean"


@dataclass(frozen=True)
class Verdict:
    name: str
    version: str
    state: str
    source: str = ""  # which record decided it
    advisories: tuple[str, ...] = field(default=())  # "ID (fixed in X)"
    reason: str = ""  # why unaudited


Fetch = Callable[[str], "dict | None"]  # URL -> parsed JSON, None on 404


def http_fetch(timeout: float = 30.0) -> Fetch:
    def fetch(url: str) -> dict | None:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    return fetch


def installed(skip: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(name, version) of every installed distribution but editable ones (the project
    under test is not on PyPI) and those named in `skip`."""
    dists = list(importlib.metadata.distributions())
    # An editable project may also be found through a stale `*.egg-info` in the working
    # directory: every copy of an editable name is skipped.
    skipped = {_norm(s) for s in skip} | {
        _norm(d.metadata["Name"] or "") for d in dists if _editable(d)
    }
    out: set[tuple[str, str]] = set()
    for dist in dists:
        name = dist.metadata["Name"]
        if name and _norm(name) not in skipped:
            out.add((name, dist.version))
    return sorted(out, key=lambda nv: _norm(nv[0]))


def audit_one(name: str, version: str, fetch: Fetch, index: str = DEFAULT_INDEX) -> Verdict:
    base = f"{index.rstrip('/')}/pypi/{name}"
    try:
        release = fetch(f"{base}/{version}/json")
        if release is not None:
            return _judge(name, version, release.get("vulnerabilities"), "release record")
        project = fetch(f"{base}/json")
    except Exception as e:  # network, JSON: this one is unaudited, the rest go on
        return Verdict(name, version, UNAUDITED, reason=f"{type(e).__name__}: {e}")
    if project is None:
        return Verdict(name, version, UNAUDITED, reason="not on the index")
    latest = (project.get("info") or {}).get("version")
    if latest != version:
        return Verdict(
            name,
            version,
            UNAUDITED,
            reason=f"not the newest release ({latest}) and its own record is unreachable",
        )
    return _judge(name, version, project.get("vulnerabilities"), "project record (newest)")


def audit(
    dists: Iterable[tuple[str, str]], fetch: Fetch, index: str = DEFAULT_INDEX, workers: int = 8
) -> list[Verdict]:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda nv: audit_one(nv[0], nv[1], fetch, index), dists))


def _judge(name: str, version: str, vulns: object, source: str) -> Verdict:
    if not isinstance(vulns, list):
        return Verdict(name, version, UNAUDITED, source, reason="no vulnerabilities field")
    found = []
    for v in vulns:
        if not isinstance(v, dict) or v.get("withdrawn"):
            continue
        fixed = ", ".join(v.get("fixed_in") or []) or "no fix yet"
        found.append(f"{v.get('id', '?')} (fixed in {fixed})")
    return Verdict(name, version, VULNERABLE if found else CLEAN, source, tuple(found))


def _editable(dist: importlib.metadata.Distribution) -> bool:
    text = dist.read_text("direct_url.json")
    if not text:
        return False
    try:
        return bool(json.loads(text).get("dir_info", {}).get("editable"))
    except (ValueError, AttributeError):
        return False


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index-url", default=DEFAULT_INDEX, help="PyPI's JSON API base")
    ap.add_argument("--strict", action="store_true", help="exit 2 if any is unaudited")
    ap.add_argument("--skip", action="append", default=[], metavar="NAME")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per request (30)")
    args = ap.parse_args(argv)
    verdicts = audit(installed(args.skip), http_fetch(args.timeout), args.index_url)
    counts = {s: 0 for s in (VULNERABLE, UNAUDITED, CLEAN)}
    for v in verdicts:
        counts[v.state] += 1
        if v.state == VULNERABLE:
            print(f"VULNERABLE {v.name} {v.version}: {'; '.join(v.advisories)}")
        elif v.state == UNAUDITED:
            print(f"unaudited  {v.name} {v.version}: {v.reason}")
    print(
        f"{len(verdicts)} distributions: {counts[CLEAN]} clean, "
        f"{counts[VULNERABLE]} vulnerable, {counts[UNAUDITED]} unaudited ({args.index_url})"
    )
    if counts[VULNERABLE]:
        return 1
    return 2 if args.strict and counts[UNAUDITED] else 0


if __name__ == "__main__":
    sys.exit(main())
