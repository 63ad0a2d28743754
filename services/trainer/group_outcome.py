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
from streamrec.trainer import distributed as ddp
from streamrec.trainer.errors import BadSplits, DataError, GroupError, PassFailed

#: exchange_outcomes codes of a rank's part of a phase.
OK, DATA_FAILURE, OTHER_FAILURE = 0, 1, 2


def share_pass_outcome(
    rank: int,
    spec: layout.PassSpec,
    failure: Exception | None,
    files: list[Path],
    phase: str = "train",
) -> None:
    """Every rank learns every rank's outcome of a ``phase`` of ``spec`` (one exchange); when
    any failed, all raise the same :class:`PassFailed` (:class:`BadSplits`, naming the bad
    splits, when some rank's data was bad; else ``transient``).

    Args:
        rank: this rank.
        failure: this rank's error in the phase, None when it succeeded.
        files: this rank's files of the pass (a DataError naming one marks its split).
    """
    code, marks, message = OK, [0] * len(spec.splits), ""
    if failure is not None and not isinstance(failure, GroupError):
        code = DATA_FAILURE if isinstance(failure, DataError) else OTHER_FAILURE
        message = f"{type(failure).__name__}: {failure}"
        if code == DATA_FAILURE:
            for path in files:
                if str(path) in str(failure) and path.parent.name in spec.splits:
                    marks[spec.splits.index(path.parent.name)] = 1
    outcomes = ddp.exchange_outcomes(code, marks, message)
    failed = [o for o in outcomes if o.code != OK]
    if not failed and failure is not None:  # only GroupErrors: the culprit said nothing
        failed = [ddp.RankOutcome(rank, OTHER_FAILURE, tuple(marks), str(failure))]
    if not failed:
        return
    kind = "data" if any(o.code == DATA_FAILURE for o in failed) else "transient"
    bad = tuple(s for i, s in enumerate(spec.splits) if any(o.marks[i] for o in failed))
    text = "; ".join(f"rank {o.rank}: {o.message}" for o in failed)
    cls = BadSplits if kind == "data" else PassFailed
    raise cls(
        f"pass {spec.day}/{spec.pass_id} failed ({kind}): {text}", kind, bad, phase
    ) from failure


def agree(failure: Exception | None, what: str) -> None:
    """Outside a pass (saves, loads): every rank raises when any rank failed ``what`` (its
    own error, or :class:`GroupError` quoting the failed rank's)."""
    message = f"{type(failure).__name__}: {failure}" if failure is not None else ""
    outcomes = ddp.exchange_outcomes(OTHER_FAILURE if failure else OK, [], message)
    if failure is not None:
        raise failure
    failed = [o for o in outcomes if o.code != OK]
    if failed:
        raise GroupError(
            f"{what} failed: " + "; ".join(f"rank {o.rank}: {o.message}" for o in failed)
        )
