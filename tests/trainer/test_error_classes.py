"""A failed pass's ErrorClass comes from the types of its exceptions and, across ranks, from
the class every rank exchanges with its outcome: never from error text."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamrec.control.reports import ErrorClass
from streamrec.embedding_store import ShardRestarted, UnknownNamespace
from streamrec.errors import RemoteError, RpcTimeout, ServiceUnavailable
from streamrec.layout import PassSpec
from streamrec.sampler.errors import SamplerRefused, SamplerUnavailable
from streamrec.trainer.errors import (
    BadSplits,
    DataError,
    GroupError,
    LineageLost,
    PassFailed,
    error_class,
)
from streamrec.trainer.group_outcome import agree, class_of, code_of, share_pass_outcome

SPEC = PassSpec("20190720", 1, ("0000", "0005"))


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ShardRestarted("shard 1 restarted empty"), ErrorClass.STORE_LOST),
        (UnknownNamespace("job-1"), ErrorClass.STORE_LOST),
        (LineageLost("no pass 1"), ErrorClass.STORE_LOST),
        (RpcTimeout("no reply"), ErrorClass.INFRA),
        (ServiceUnavailable("down"), ErrorClass.INFRA),
        (SamplerUnavailable("down"), ErrorClass.INFRA),
        (SamplerRefused("their token"), ErrorClass.INFRA),
        (PassFailed("p", ErrorClass.DATA, ("0000",)), ErrorClass.DATA),
        (GroupError("rank 1: ...", ErrorClass.INFRA), ErrorClass.INFRA),
        # a full disk is the disk's state: a restart with backoff, not a failed attempt
        (OSError(28, "No space left on device"), ErrorClass.INFRA),
        (OSError(122, "Disk quota exceeded"), ErrorClass.INFRA),
        (RemoteError("no_space", "shard 0: no space left"), ErrorClass.INFRA),
        (OSError(5, "Input/output error"), ErrorClass.TRANSIENT),
        # a message that quotes a type name is only text
        (RuntimeError("ShardRestarted: RpcTimeout: quoted"), ErrorClass.TRANSIENT),
        (GroupError("rank 1: ShardRestarted: quoted"), ErrorClass.TRANSIENT),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_an_error_is_classed_by_its_type(exc, expected):
    assert error_class(exc) == expected


def test_a_cause_is_classed_too_the_most_telling_first():
    try:
        try:
            raise ShardRestarted("gone")
        except ShardRestarted as inner:
            raise OSError("while saving") from inner
    except OSError as outer:
        assert error_class(outer) == ErrorClass.STORE_LOST
    wrapped = PassFailed("p", ErrorClass.INFRA)
    wrapped.__cause__ = LineageLost("no pass 1")
    assert error_class(wrapped) == ErrorClass.STORE_LOST


def test_exchange_codes_round_trip_every_class():
    assert sorted(code_of(c) for c in ErrorClass) == [1, 2, 3, 4]  # 0 is success
    assert all(class_of(code_of(c)) == c for c in ErrorClass)


def test_a_pass_fails_with_the_class_of_the_ranks_error():
    with pytest.raises(PassFailed) as err:
        share_pass_outcome(0, SPEC, ShardRestarted("shard 0 restarted"), [])
    assert err.value.kind == ErrorClass.STORE_LOST and not isinstance(err.value, BadSplits)
    assert "rank 0: ShardRestarted: shard 0 restarted" in str(err.value)
    assert error_class(err.value) == ErrorClass.STORE_LOST


def test_a_pass_whose_rank_only_heard_of_a_peer_failure_keeps_the_peers_class():
    with pytest.raises(PassFailed) as err:
        share_pass_outcome(0, SPEC, GroupError("rank 1 failed", ErrorClass.INFRA), [])
    assert err.value.kind == ErrorClass.INFRA


def test_bad_data_fails_the_pass_as_data_naming_the_split(tmp_path: Path):
    bad = tmp_path / "0005" / "part-00000"
    with pytest.raises(BadSplits) as err:
        share_pass_outcome(0, SPEC, DataError(f"{bad}: line 3 malformed"), [bad])
    assert err.value.kind == ErrorClass.DATA and err.value.bad_splits == ("0005",)


def test_a_phase_outside_a_pass_raises_the_ranks_own_error():
    agree(None, "a save")  # success: nothing raised
    own = RpcTimeout("no reply from shard 2")
    with pytest.raises(RpcTimeout) as err:
        agree(own, "a save")
    assert err.value is own


def test_a_failed_pass_text_names_the_class_it_is_classed_as(monkeypatch):
    """Rank 0 only heard of a sampler failure on a peer (a GroupError of class infra) while
    another peer failed transient: the pass is classed infra (the error's chain), and its text
    says so, not "(transient)"."""
    from streamrec.trainer import distributed as ddp

    def exchanged(code: int, marks: list[int], message: str = "") -> list[ddp.RankOutcome]:
        transient = code_of(ErrorClass.TRANSIENT)
        mine, theirs = ddp.RankOutcome(0, code, tuple(marks), message), (0,) * len(marks)
        return [mine, ddp.RankOutcome(2, transient, theirs, "OSError: disk")]

    monkeypatch.setattr(ddp, "exchange_outcomes", exchanged)
    heard = GroupError("rank 1: SamplerUnavailable: no sampler server answers", ErrorClass.INFRA)
    with pytest.raises(PassFailed) as err:
        share_pass_outcome(0, SPEC, heard, [])
    assert error_class(err.value) == ErrorClass.INFRA
    assert err.value.kind == ErrorClass.INFRA
    assert "failed (infra)" in str(err.value), str(err.value)
