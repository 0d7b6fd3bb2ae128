"""Tests load configs as `epp serve` does: the built-in plugins registered first."""

import pytest

from epp.composition import install_plugins


@pytest.fixture(autouse=True, scope="session")
def builtin_plugins() -> None:
    install_plugins()
