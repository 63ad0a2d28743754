"""A pass handed out to the trainers: one entry of the job's work stream (``keys.work``).

The scheduler writes it (:meth:`WorkItem.to_fields`), a trainer group reads it back
(:meth:`WorkItem.from_fields`). Every value of a stream entry is a string::

    day          "20190720"
    pass_id      "3"
    splits       '["0000", "0005"]'   JSON list: the pass's splits in order
    attempt      "2"                  1 for the first hand-out of the pass
    resume_from  "20190720/1" or ""   the checkpoint to load first ("": none named)
    after        "20190720/2" or ""   the pass before this one ("": the first)
    skip         '["0005"]'           JSON list: splits on_bad_split: skip leaves out
    ts           "1764270000.123"     when it was handed out (unix s)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from streamrec.control import codec
from streamrec.layout import PassSpec

_WHERE = "work item"


@dataclass(frozen=True)
class WorkItem:
    """A pass taken from the work stream; ``msg_id`` is what ``ack_pass`` needs ("" for one
    not yet written).

    ``after`` is the pass before this one in training order (None for the first): a group
    whose model is the state after it goes on in memory; any other group first loads
    ``resume_from`` (the checkpoint the API names), never whatever is newest on disk.
    ``skip``: splits the job's ``on_bad_split: skip`` policy leaves out of this pass.
    """

    msg_id: str
    spec: PassSpec
    attempt: int
    resume_from: str | None
    after: str | None = None
    skip: tuple[str, ...] = ()

    def to_fields(self, ts: float) -> dict[str, str]:
        """The work stream entry (``ts``: the hand-out time)."""
        return {
            "day": self.spec.day,
            "pass_id": str(self.spec.pass_id),
            "splits": json.dumps(list(self.spec.splits)),
            "attempt": str(self.attempt),
            "resume_from": self.resume_from or "",
            "after": self.after or "",
            "skip": json.dumps(list(self.skip)),
            "ts": f"{ts:.3f}",
        }

    @classmethod
    def from_fields(cls, msg_id: str, fields: dict[str, str]) -> WorkItem:
        """The item of a work stream entry; ContractError names a missing or bad field
        (``attempt``, ``resume_from``, ``after`` and ``skip`` may be absent)."""
        spec = PassSpec(
            codec.text(fields, "day", _WHERE),
            codec.text_int(fields, "pass_id", _WHERE),
            codec.text_list(fields, "splits", _WHERE),
        )
        return cls(
            msg_id,
            spec,
            codec.text_int(fields, "attempt", _WHERE, default=1),
            codec.text_or_none(fields, "resume_from"),
            codec.text_or_none(fields, "after"),
            codec.text_list(fields, "skip", _WHERE, required=False),
        )
