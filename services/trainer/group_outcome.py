"""The group fails or succeeds together: each rank's outcome of a phase, exchanged.

A phase of a pass (predict, train, saves) or a group operation outside a pass (a save, a
load, a store call made by rank 0) ends with one exchange of every rank's outcome
(:func:`~.distributed.exchange_outcomes`: a code, the splits a rank found bad, a message), so
a failure on any rank raises on all of them alike and no rank waits in a collective the
others left.
"""

from __future__ import annotations

from pathlib import Path

from streamrec import layout
from streamrec.control.reports import ErrorClass, Phase
from streamrec.trainer import distributed as ddp
from streamrec.trainer.errors import (
    PRECEDENCE,
    BadSplits,
    DataError,
    GroupError,
    PassFailed,
    error_class,
    first_class,
)

#: exchange_outcomes code of a rank whose part of a phase succeeded; a failed rank's code
#: is its ErrorClass's (:func:`code_of`), so every rank knows every failed rank's class.
OK = 0


def code_of(kind: ErrorClass) -> int:
    """The exchange code of a failed rank of class ``kind`` (1 and up)."""
    return 1 + PRECEDENCE.index(kind)


def class_of(code: int) -> ErrorClass:
    """The inverse of :func:`code_of`."""
    return PRECEDENCE[code - 1]


DATA_FAILURE = code_of(ErrorClass.DATA)


def share_pass_outcome(
    rank: int,
    spec: layout.PassSpec,
    failure: Exception | None,
    files: list[Path],
    phase: str = Phase.TRAIN,
) -> None:
    """Every rank learns every rank's outcome of a ``phase`` of ``spec`` (one exchange); when
    any failed, all raise the same :class:`PassFailed` (:class:`BadSplits`, naming the bad
    splits, when some rank's data was bad; else of the failed ranks' most telling class).

    Args:
        rank: this rank.
        failure: this rank's error in the phase, None when it succeeded.
        files: this rank's files of the pass (a DataError naming one marks its split).
    """
    code, marks, message = OK, [0] * len(spec.splits), ""
    if failure is not None and not isinstance(failure, GroupError):
        code = DATA_FAILURE if isinstance(failure, DataError) else code_of(error_class(failure))
        message = f"{type(failure).__name__}: {failure}"
        if code == DATA_FAILURE:
            for path in files:
                if str(path) in str(failure) and path.parent.name in spec.splits:
                    marks[spec.splits.index(path.parent.name)] = 1
    outcomes = ddp.exchange_outcomes(code, marks, message)
    failed = [o for o in outcomes if o.code != OK]
    if not failed and failure is not None:  # only GroupErrors: the culprit said nothing
        own = code_of(error_class(failure))
        failed = [ddp.RankOutcome(rank, own, tuple(marks), str(failure))]
    if not failed:
        return
    # this rank's own error counts too, a GroupError included (it carries the class of a
    # failure it heard of): the text names the class error_class gives the raised error
    own_kind = [error_class(failure)] if failure is not None else []
    kind = first_class([class_of(o.code) for o in failed] + own_kind)
    bad = tuple(s for i, s in enumerate(spec.splits) if any(o.marks[i] for o in failed))
    text = "; ".join(f"rank {o.rank}: {o.message}" for o in failed)
    cls = BadSplits if kind == ErrorClass.DATA else PassFailed
    raise cls(
        f"pass {spec.day}/{spec.pass_id} failed ({kind}): {text}", kind, bad, phase
    ) from failure


def agree(failure: Exception | None, what: str) -> None:
    """Outside a pass (saves, loads): every rank raises when any rank failed ``what`` (its
    own error, or :class:`GroupError` quoting the failed rank's, of their class)."""
    message = f"{type(failure).__name__}: {failure}" if failure is not None else ""
    code = code_of(error_class(failure)) if failure is not None else OK
    outcomes = ddp.exchange_outcomes(code, [], message)
    if failure is not None:
        raise failure
    failed = [o for o in outcomes if o.code != OK]
    if failed:
        raise GroupError(
            f"{what} failed: " + "; ".join(f"rank {o.rank}: {o.message}" for o in failed),
            first_class([class_of(o.code) for o in failed]),
        )
