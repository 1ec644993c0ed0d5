"""The gate suites' markers (gpupool/gate/plugin.py registers them in a gate's run), known to
the unit tests too: tests/gate/test_xid_cursor.py calls a suite's check directly."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tier(name): the lowest tier that runs this check")
    config.addinivalue_line("markers", "action(name): advised action when the check fails")
