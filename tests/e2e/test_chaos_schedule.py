"""The chaos schedule (:class:`chaos_harness.Schedule`): every kind faulted once per way
first, then the double faults asked for, then random ones, the same for the same seed; bad
settings refused naming the setting."""

from __future__ import annotations

import itertools
import random

import pytest
from chaos_harness import KINDS, Schedule


def shots(schedule: Schedule, n: int) -> list:
    return list(itertools.islice(schedule.plan(random.Random(schedule.seed)), n))


def test_every_kind_killed_then_frozen_then_a_double_fault():
    schedule = Schedule(
        3, interval=(0.5, 1.0), freeze_s=(5.0, 6.0), first=("kill", "freeze"), doubles_first=1
    )
    plan = shots(schedule, 2 * len(KINDS) + 1)
    kills, freezes, double = plan[: len(KINDS)], plan[len(KINDS) : -1], plan[-1]
    assert sorted(s.kind for s in kills) == sorted(KINDS)
    assert all(s.how == "kill" and s.thaw_s == 0 and s.partner is None for s in kills)
    assert sorted(s.kind for s in freezes) == sorted(KINDS)
    assert all(s.how == "freeze" and 5.0 <= s.thaw_s <= 6.0 for s in freezes)
    assert all(0.5 <= s.delay <= 1.0 for s in plan)
    assert double.partner is not None and double.partner.kind != double.kind
    assert 0.0 <= double.partner.delay <= 1.0
    assert any(s.on_done and s.kind.startswith("trainer") and s.how == "kill" for s in kills)
    assert [(s.kind, s.how, s.delay) for s in plan] == [
        (s.kind, s.how, s.delay) for s in shots(schedule, len(plan))
    ]


def test_the_random_faults_follow_their_shares():
    schedule = Schedule(9, first=(), freeze_share=0.5, double_share=0.25)
    plan = shots(schedule, 400)
    frozen = sum(s.how == "freeze" for s in plan) / len(plan)
    doubled = sum(s.partner is not None for s in plan) / len(plan)
    assert 0.4 < frozen < 0.6 and 0.15 < doubled < 0.35
    assert not any(s.how == "freeze" for s in shots(Schedule(9, first=()), 100))


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"kinds": ("store", "disk")}, "kinds"),
        ({"interval": (3.0, 1.0)}, "interval"),
        ({"freeze_s": (-1.0, 5.0)}, "freeze_s"),
        ({"freeze_share": 1.5}, "freeze_share"),
        ({"double_share": -0.1}, "double_share"),
        ({"first": ("pause",)}, "first"),
        ({"kinds": ("store",), "doubles_first": 1}, "double fault"),
    ],
)
def test_bad_settings_are_refused_naming_them(settings, named):
    with pytest.raises(ValueError, match=named):
        Schedule(1, **settings)
