"""Test-session set-up: runs before any test module is imported."""

import os
import signal

# Before numpy loads: OpenBLAS spins one thread per core; on this 2-core machine shared
# by several agents a statsmodels ARIMA fit then runs ~10x slower (1.9 s vs 22.9 s for
# one order search measured side by side). Single-threaded BLAS suits small fits.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# A shell without job control starts a background command with SIGINT ignored, and a
# process started with SIGINT ignored passes that on to every program it runs: the
# Ctrl-C tests (`epp demo`, the harness's children) would then interrupt nothing.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest

from epp.composition import install_plugins


@pytest.fixture(autouse=True, scope="session")
def builtin_plugins() -> None:
    """Tests load configs as `epp serve` does: the built-in plugins registered first."""
    install_plugins()
