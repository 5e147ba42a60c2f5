"""bench/upgrade_gap.py: gaps from health polls and the share of instances serving."""

import importlib.util
import os

import pytest
from conftest import ROOT

_PATH = os.path.join(ROOT, "bench", "upgrade_gap.py")
_SPEC = importlib.util.spec_from_file_location("upgrade_gap", _PATH)
upgrade_gap = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(upgrade_gap)


class _Polls:
    def __init__(self, samples):
        self.samples = samples


def test_no_gap_when_always_healthy():
    assert upgrade_gap.gaps_of([(0.0, True), (0.2, True), (0.4, True)]) == []


def test_gap_runs_from_first_failure_to_next_success():
    samples = [(0.0, True), (1.0, False), (1.2, False), (3.5, True), (4.0, False), (4.5, True)]
    assert upgrade_gap.gaps_of(samples) == [(1.0, 3.5), (4.0, 4.5)]


def test_open_gap_when_never_healthy_again():
    assert upgrade_gap.gaps_of([(0.0, True), (1.0, False), (2.0, False)]) == [(1.0, None)]


def test_serving_share_weights_time_and_finds_the_lowest():
    # Two instances over 10 s; the second is down from 2 s to 4 s: 20% of the time at half capacity.
    pollers = [_Polls([(0.0, True)]), _Polls([(0.0, True), (2.0, False), (4.0, True)])]
    mean, lowest = upgrade_gap.serving_share(pollers, 0.0, 10.0, step=0.01)
    assert mean == pytest.approx(0.9, abs=0.01)
    assert lowest == 0.5


def test_serving_share_of_nothing():
    assert upgrade_gap.serving_share([], 0.0, 1.0) == (None, None)
