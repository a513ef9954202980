"""What the alert tests share: one instant every clock read returns, and the rules a fresh installation has.
Import both fixtures into a test module (they are autouse there): `from tests.alert_clock import ...`."""
from datetime import UTC, datetime

import pytest
import time_machine

from alerts.defaults import ensure_default_rules

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def frozen_clock():
    """Every clock read in these tests (row defaults, code without an injected time) reads NOW."""
    with time_machine.travel(NOW, tick=False):
        yield


@pytest.fixture(autouse=True)
def default_rules(db):
    """The global rules a fresh installation has (a transactional test elsewhere may have flushed them)."""
    ensure_default_rules()
