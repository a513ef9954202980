"""The fast lane's selection: a module that conftest leaves uncollected when its marker is deselected carries
that marker on every test, so leaving it out drops nothing the lane would have run."""
import importlib

import pytest

from tests.conftest import COSTLY_TO_COLLECT


@pytest.mark.parametrize(("module", "marker"), sorted(COSTLY_TO_COLLECT.items()))
def test_a_module_left_uncollected_marks_every_test_with_its_marker(module, marker):
    marks = importlib.import_module(f"tests.{module.removesuffix('.py')}").pytestmark
    assert marker in [mark.name for mark in (marks if isinstance(marks, list) else [marks])]
