#!/bin/sh
# Debian packages the tests run for real: Prometheus (with promtool) scrapes the EPP, the
# simulator and the sidecar in tests/integration/test_prometheus_dashboard.py, and Chromium
# loads the status page in tests/e2e/test_status_page.py. Installed only when missing
# (`apt-get update` once, then one `apt-get install`), bounded by EPP_APT_TIMEOUT seconds
# (default 900; measured: 27 s on this project's machine for both, docs/observability.md).
# Usage: scripts/system-packages.sh [--check]   (--check: report, install nothing)
set -u
need=""
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need="$need prometheus"
command -v chromium >/dev/null 2>&1 || need="$need chromium"
[ -z "$need" ] && exit 0
if [ "${1:-}" = "--check" ]; then
    echo "missing Debian packages:$need" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "system-packages: need the Debian packages$need (no apt-get here: install them by hand)" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
        echo "system-packages: need root (or sudo) to apt-get install$need" >&2
        exit 1
    fi
fi
limit="${EPP_APT_TIMEOUT:-900}"
echo "system-packages: installing$need (apt-get, at most ${limit}s)" >&2
start=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
if ! timeout "$limit" $sudo apt-get update -q >/dev/null \
   || ! timeout "$limit" $sudo apt-get install -y -q --no-install-recommends $need >/dev/null; then
    echo "system-packages: 'apt-get install$need' failed or took over ${limit}s;" \
         "install them by hand (apt-get install$need) and run make test again" >&2
    exit 1
fi
echo "system-packages: installed$need in $(( $(date +%s) - start ))s" >&2
