"""Test-session set-up that must run before any test module imports numpy."""

import os

# OpenBLAS spins one thread per core; on this 2-core machine shared by several agents a
# statsmodels ARIMA fit then runs ~10x slower (1.9 s vs 22.9 s for one order search
# measured side by side). Single-threaded BLAS is also what small fits want.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
