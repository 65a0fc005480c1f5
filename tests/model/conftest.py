"""Session fixtures for model tests (each config's functions compile once per session)."""

import pytest
from model_testlib import Model, tiny_cfg, variant_cfg


@pytest.fixture(scope="session")
def tiny():
    return Model(tiny_cfg())


@pytest.fixture(scope="session")
def variant():
    return Model(variant_cfg())
