"""Test-session set-up: runs before any test module is imported."""

import os

# Before numpy loads: OpenBLAS spins one thread per core; on this 2-core machine shared
# by several agents a statsmodels ARIMA fit then runs ~10x slower (1.9 s vs 22.9 s for
# one order search measured side by side). Single-threaded BLAS suits small fits.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest

from epp.composition import install_plugins


@pytest.fixture(autouse=True, scope="session")
def builtin_plugins() -> None:
    """Tests load configs as `epp serve` does: the built-in plugins registered first."""
    install_plugins()
