"""A command for a job's trainer group: one entry of the job's command stream
(``keys.commands``).

The API writes it (an operator's stop, a trigger: :meth:`Command.to_fields`), rank 0 of the
group reads it back (:meth:`Command.from_fields`). Every value of a stream entry is a
string::

    type        "export"            a CommandType value (an unknown one is kept as sent)
    mode        "delta" or ""       the save mode of an export ("": none)
    trigger_id  "5f0c9d2e41aa" or ""  the trigger it carries out ("": none, a stop)
    ts          "1764270000.123"    when it was issued (unix s): older than the job's last
                                    start, it is dropped unread
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from streamrec.control import codec

_WHERE = "command"


class CommandType(StrEnum):
    """What the control plane asks of a trainer group on a job's command stream."""

    CHECKPOINT = "checkpoint"
    EXPORT = "export"
    SHRINK = "shrink"
    STOP = "stop"


@dataclass(frozen=True)
class Command:
    """A command for the trainer group: a :class:`CommandType` value (an unknown one is
    kept as sent, for the agent to log), the save mode of an export, its trigger, when it
    was issued, and its stream entry (what ``TrainerChannel.ack_command`` needs once it is
    carried out; None for one not yet written)."""

    type: str
    mode: str | None = None
    trigger_id: str | None = None
    ts: float = 0.0
    msg_id: str | None = None

    def to_fields(self) -> dict[str, str]:
        """The command stream entry."""
        return {
            "type": str(self.type),
            "mode": self.mode or "",
            "trigger_id": self.trigger_id or "",
            "ts": f"{self.ts:.3f}",
        }

    @classmethod
    def from_fields(cls, msg_id: str | None, fields: Mapping[str, str]) -> Command:
        """The command of a stream entry; an absent ``type`` reads "" (unknown), an absent
        ``ts`` 0 (issued before any start). ContractError names a ``ts`` that is no
        number."""
        return cls(
            fields.get("type", ""),
            codec.text_or_none(fields, "mode"),
            codec.text_or_none(fields, "trigger_id"),
            codec.text_float(fields, "ts", _WHERE, default=0.0),
            msg_id,
        )
