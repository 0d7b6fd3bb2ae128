"""The prefill queue model on cases with known M/M/c answers."""

from __future__ import annotations

import math

import pytest

from epp.planner.core.queueing import erlang_c, smallest_servers, wait_mean, wait_quantile


def test_erlang_c_known_values():
    # M/M/1: P(wait) = rho. a = 0.5 -> 0.5
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    # M/M/2, a = 1 (rho 0.5): B(1) = 1/(1+1) = 0.5, B(2) = 1·0.5/(2 + 0.5) = 0.2,
    # C = 2·0.2 / (2 - 1·(1 - 0.2)) = 0.4/1.2 = 1/3
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(2, 2.0) == 1.0  # unstable
    assert erlang_c(3, 0.0) == 0.0


def test_wait_mean_is_mm1_when_poisson_exponential():
    # M/M/1, E[S] = 1 s, a = 0.5: E[Wq] = rho/(mu - lambda) = 0.5/(1 - 0.5) = 1 s.
    # Formula: C · E[S]/(c - a) · scv = 0.5 · 1/0.5 · 1 = 1
    assert wait_mean(1, 0.5, 1.0, scv=1.0) == pytest.approx(1.0)
    # scv 2 (bursty): twice the wait
    assert wait_mean(1, 0.5, 1.0, scv=2.0) == pytest.approx(2.0)
    assert wait_mean(1, 1.5, 1.0, scv=1.0) == math.inf


def test_wait_quantile_mm1():
    # M/M/1: P(Wq > t) = rho · exp(-(mu - lambda) t). rho 0.5, mu 1, lambda 0.5:
    # p90: 0.5 · exp(-0.5 t) = 0.1 -> t = ln(5)/0.5 = 3.219 s
    assert wait_quantile(1, 0.5, 1.0, 0.9, scv=1.0) == pytest.approx(math.log(5) / 0.5)
    # p50: P(wait) = 0.5 <= 1 - 0.5: half never wait -> 0
    assert wait_quantile(1, 0.5, 1.0, 0.5, scv=1.0) == 0.0


def test_smallest_servers_adds_replicas_for_queueing():
    # a = 1.8 replicas of load, E[S] = 0.5 s, p90 wait budget 0.1 s.
    # c = 2: rho 0.9, B(2) = 1.8²/2 / (1 + 1.8 + 1.62) = 1.62/4.42 = 0.3665,
    #   C = 2·0.3665/(2 - 1.8·0.6335) = 0.733/0.8597 = 0.8526;
    #   t90 = ln(0.8526/0.1) / ((2-1.8)/0.5) = 2.143/0.4 = 5.36 s > 0.1
    # c = 3: B(3) = 1.8·0.36652/(3 + 0.65973) = 0.18027,
    #   C = 3·0.18027/(3 - 1.8·0.81973) = 0.54080/1.52448 = 0.35474,
    #   t90 = ln(3.5474)/((3-1.8)/0.5) = 1.2662/2.4 = 0.5276 s > 0.1
    # c = 4: B(4) = 1.8·0.1803/(4 + 0.3245) = 0.0750, C = 4·0.0750/(4 - 1.8·0.925) = 0.1285,
    #   t90 = ln(1.285)/((4-1.8)/0.5) = 0.2508/4.4 = 0.057 s <= 0.1 -> 4
    assert wait_quantile(2, 1.8, 0.5, 0.9, 1.0) == pytest.approx(5.36, abs=0.01)
    assert wait_quantile(3, 1.8, 0.5, 0.9, 1.0) == pytest.approx(0.5276, abs=0.001)
    assert smallest_servers(1.8, 0.5, 0.1, 0.9, 1.0) == 4
    # Dynamo's throughput rule would give ceil(1.8) = 2, where the p90 wait is 5.4 s.
    assert smallest_servers(0.0, 0.5, 0.1, 0.9, 1.0) == 0
