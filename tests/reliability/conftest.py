"""The undamaged trial that the corrupt-file and fuzz tests copy and damage."""

from __future__ import annotations

import pytest

from tests.support.damaged_trials import Pristine, write_pristine


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    """A real trial written by the PyTorch hook (tests/support/damaged_trials.py), once per module."""
    return write_pristine(tmp_path_factory.mktemp("pristine") / "clean")
