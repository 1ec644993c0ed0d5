"""strategy_plugins/mitogen_linear.py, the strategy ansible.cfg names: Mitogen's linear
strategy where Mitogen is installed, Ansible's own linear strategy (with a warning) where
it is not. The lab suite runs every playbook under it."""

from __future__ import annotations

import configparser
import importlib.util
import sys
from types import ModuleType

import pytest
from ansible.plugins.strategy.linear import StrategyModule as Linear
from ansible_mitogen.strategy import StrategyMixin

from tests.conftest import ROOT

SHIM = ROOT / "strategy_plugins" / "mitogen_linear.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpupool_test_strategy", SHIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ansible_cfg_runs_the_shim() -> None:
    settings = configparser.ConfigParser(interpolation=None)
    settings.read(ROOT / "ansible.cfg")
    assert settings.get("defaults", "strategy") == SHIM.stem
    assert (ROOT / settings.get("defaults", "strategy_plugins")) == SHIM.parent


def test_with_mitogen_it_is_mitogens_linear_strategy() -> None:
    strategy = _load().StrategyModule
    assert issubclass(strategy, StrategyMixin) and issubclass(strategy, Linear)


def test_without_mitogen_it_is_ansibles_own_and_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ansible_mitogen.strategy", None)
    strategy = _load().StrategyModule
    assert issubclass(strategy, Linear) and not issubclass(strategy, StrategyMixin)
    captured = capsys.readouterr()
    assert "Mitogen is not installed" in captured.out + captured.err
