"""``LocalRpcDataSampler``: RecIS's negative-sampling client, over StreamRec's wire protocol.

A RecIS user switches by changing one import::

    from streamrec.sampler import LocalRpcDataSampler   # was recis.data.local_rpc_data_sampler
    from streamrec.ragged import RaggedTensor

The first client on a node starts the server if none answers (a lock file makes racing
clients start exactly one; the server itself holds ``<socket>.lock`` while it runs); every
other client, in any process, shares it. Tables given as Parquet paths are read here, in
the client, so the server needs no access to the file.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from streamrec.auth import token_file
from streamrec.errors import BadRequest, RemoteError
from streamrec.process import stop_process
from streamrec.ragged import RaggedTensor
from streamrec.sampler.columns import Column, decode_columns, encode_columns, to_columns
from streamrec.sampler.config import (
    AUTO_START_IDLE_EXIT_S,
    IDLE_EXIT_ENV,
    check_endpoint,
    default_endpoint,
    lock_base,
)
from streamrec.sampler.errors import BadTable, NoTable, TagMismatch
from streamrec.sampler.link import ServerLink

_REMOTE_ERRORS: dict[str, type[Exception]] = {
    "bad_request": BadRequest,
    "bad_table": BadTable,
    "no_table": NoTable,
    "tag_mismatch": TagMismatch,
}


class LocalRpcDataSampler:
    """Client of the node-local sampler server.

    Args:
        sample_tag: category column of the negative table (one int per row).
        dedup_tag: item id column (one int per row, unique); negatives are these ids.
        weight_tag: weight column (finite, >= 0); items are drawn proportionally to it.
        skey_name: RecIS's deprecated string column; it must exist in the table.
        put_back: draw with replacement (``True``) or distinct negatives per positive.
        endpoint: server address; default ``$STREAMREC_SAMPLER_ENDPOINT`` or a per-user ipc
            socket (see :mod:`streamrec.sampler.config`).
        auto_start: start a server when none answers (``False`` raises instead).
        timeout_s: how long one request may take.
        start_timeout_s: how long to wait for a starting server.
        missing_id: id put in negative slots that cannot be filled (unknown category, or too
            few allowed items; see :meth:`sample_ids`).
        label_name: name of the label column that :meth:`combine` adds.
        server_args: extra ``streamrec-sampler serve`` flags for an auto-started server.
        auth_token_file: the file holding the server's peer token; None:
            ``$STREAMREC_AUTH_TOKEN_FILE``, else the per-user file (:mod:`streamrec.auth`).
            An auto-started server is given the same file.
        reconnect_timeout_s: how long a call waits for a server that died or restarted to
            answer again (one auto-started, or restarted by whoever runs it) before it
            raises :class:`SamplerUnavailable`; 0: no recovery, the call raises at once.
        idle_exit_s: an auto-started server exits after this long without a request
            (``$STREAMREC_SAMPLER_IDLE_EXIT_S`` overrides it; 0: never).

    A server that dies or is replaced under a client is survived: the call in hand waits
    for a server at the endpoint again (starting one when ``auto_start``), puts the table
    back when the new server has none (the table this client last loaded, or the one named
    by :meth:`keep_table`; one client of the node does it, the others find it loaded, see
    :meth:`_restore_table`) and is sent again.
    """

    def __init__(
        self,
        sample_tag: str,
        dedup_tag: str,
        weight_tag: str,
        skey_name: str,
        put_back: bool = True,
        *,
        endpoint: str | None = None,
        auto_start: bool = True,
        timeout_s: float = 60.0,
        start_timeout_s: float = 60.0,
        missing_id: int = -1,
        label_name: str = "label",
        server_args: Sequence[str] = (),
        auth_token_file: str | os.PathLike[str] | None = None,
        reconnect_timeout_s: float = 120.0,
        idle_exit_s: float = AUTO_START_IDLE_EXIT_S,
    ) -> None:
        for name, value in (
            ("sample_tag", sample_tag),
            ("dedup_tag", dedup_tag),
            ("weight_tag", weight_tag),
            ("skey_name", skey_name),
        ):
            if not isinstance(value, str) or not value:
                raise BadRequest(f"{name} must be a non-empty column name, got {value!r}")
        if not isinstance(put_back, bool):
            raise BadRequest(f"put_back must be True or False, got {put_back!r}")
        if timeout_s <= 0 or start_timeout_s <= 0:
            raise BadRequest(
                f"timeouts must be > 0, got timeout_s={timeout_s}, "
                f"start_timeout_s={start_timeout_s}"
            )
        self.tags = {
            "sample_tag": sample_tag,
            "dedup_tag": dedup_tag,
            "weight_tag": weight_tag,
            "skey_name": skey_name,
        }
        self.sample_tag, self.dedup_tag = sample_tag, dedup_tag
        self.put_back = put_back
        self.missing_id = int(missing_id)
        self.label_name = label_name
        self.endpoint = check_endpoint(endpoint) if endpoint else default_endpoint()
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.auth_token_file = token_file(auth_token_file)
        idle = _idle_exit(idle_exit_s)
        self._link = ServerLink(
            self.endpoint,
            self.auth_token_file,
            auto_start=auto_start,
            timeout_s=timeout_s,
            start_timeout_s=start_timeout_s,
            reconnect_timeout_s=max(0.0, float(reconnect_timeout_s)),
            serve_args=[
                *([] if "--idle-exit-s" in server_args else ["--idle-exit-s", f"{idle:g}"]),
                *server_args,
            ],
            restore=self._restore_table,
        )
        #: What a restarted server is given back (:meth:`reload`, :meth:`keep_table`).
        self._table_source: Any = None

    # ---- the server -------------------------------------------------------------------------

    def _call(
        self, op: str, meta: dict[str, Any] | None = None, arrays: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            return self._link.call(op, meta, arrays)
        except RemoteError as exc:
            cls = _REMOTE_ERRORS.get(exc.code)
            if cls is None:
                raise
            raise cls(f"sampler {op}: {exc.remote_message}") from exc

    def keep_table(self, table: Any) -> None:
        """Names the table to put back into a server that replaced a dead one, without
        loading it now (:meth:`reload` names the table it loads). A Parquet path is read again
        then. Every client of a node may name it: the first to find the new server empty
        loads it, the others find it there."""
        self._table_source = table

    def _restore_table(self) -> None:
        """After a recovery to a server without a table: the node's clients queue on
        ``<socket>.reload``; the first loads its table, the others find it loaded. A client
        that names no table waits for another to load one."""
        if self._table_source is None:
            self._link.wait_for_table("this client named none: reload() or keep_table()")
            return
        base = lock_base(self.endpoint)
        with open(f"{base}.reload", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self._link.has_table():
                self.reload(self._table_source)

    @property
    def server_info(self) -> dict[str, Any]:
        """The server's ``ping``: pid, hostname, server_id, generation, rows."""
        return self._link.server_info

    @property
    def recoveries(self) -> int:
        """Servers this client found dead or replaced and came back from."""
        return self._link.recoveries

    @property
    def last_recovery_s(self) -> float:
        return self._link.last_recovery_s

    def ping(self) -> dict[str, Any]:
        return self._call("ping")[0]

    def stats(self) -> dict[str, Any]:
        return self._call("stats")[0]

    @property
    def server_pid(self) -> int | None:
        return self.server_info.get("pid")

    def close(self) -> None:
        self._link.close()

    def __enter__(self) -> LocalRpcDataSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- RecIS API ----------------------------------------------------------------------------

    def reload(self, table: Any) -> dict[str, Any]:
        """Loads or replaces the server's negative table.

        Args:
            table: a dict of column name -> 1-D tensor / ndarray / RaggedTensor / list of str,
                a list of such dicts, or a path to a Parquet file (read in this process).
                The four tag columns must exist; dedup ids unique; weights finite, >= 0.

        Returns:
            ``rows``, ``categories``, ``generation`` and build ``seconds`` of the new table.

        Raises:
            BadTable: naming the column and value; the previously loaded table stays.
        """
        spec, arrays = encode_columns(to_columns(table))
        out = self._call("reload", {"tags": self.tags, "columns": spec}, arrays)[0]
        self._table_source = table
        return out

    def sample_ids(
        self,
        dedup_tag_ragged_tensor: RaggedTensor | torch.Tensor | np.ndarray,
        sample_cnts: int | torch.Tensor | np.ndarray,
        sample_tag_ragged_tensor: RaggedTensor | torch.Tensor | np.ndarray | None = None,
        avoid_conflict: bool = True,
        avoid_conflict_with_all_dedup_tags: bool = False,
    ) -> torch.Tensor:
        """Weighted negatives for every positive.

        Args:
            dedup_tag_ragged_tensor: the positives' item ids, (b,) int values.
            sample_cnts: negatives per positive: (b,) int (may differ), or one int.
            sample_tag_ragged_tensor: the positives' categories, (b,) int values; ``None``
                draws from the whole table.
            avoid_conflict: never return a positive's own id as its negative.
            avoid_conflict_with_all_dedup_tags: never return any dedup id of the batch.

        Returns:
            (sum(sample_cnts),) int64: positive ``i``'s negatives are consecutive, in
            positive order. Items are drawn with probability proportional to weight among
            the items of the positive's category (alias tables, O(1) per draw); with
            ``put_back=False`` they are distinct per positive (successive sampling).

        Too few items: a positive whose category is not in the table, or whose category has
        no allowed item left, gets ``missing_id`` in its slots; with ``put_back=False`` a
        positive asking for more than its category allows gets each allowed item once and
        ``missing_id`` in the remaining slots. Conflicting draws are redrawn in a bounded
        number of rounds, then drawn exactly from the allowed items: it never loops forever.
        """
        dedup = _values(dedup_tag_ragged_tensor, "dedup_tag_ragged_tensor")
        cnts = _counts(sample_cnts, len(dedup))
        arrays = {"dedup": dedup, "cnts": cnts}
        if sample_tag_ragged_tensor is not None:
            arrays["categories"] = _values(sample_tag_ragged_tensor, "sample_tag_ragged_tensor")
        meta = {
            "tags": self.tags,
            "put_back": self.put_back,
            "missing_id": self.missing_id,
            "avoid_conflict": bool(avoid_conflict),
            "avoid_conflict_with_all_dedup_tags": bool(avoid_conflict_with_all_dedup_tags),
        }
        _, out = self._call("sample_ids", meta, arrays)
        return torch.from_numpy(np.array(out["ids"]))

    def valid_sample_ids(self, ids: torch.Tensor | np.ndarray, default_value: int) -> torch.Tensor:
        """``ids`` ((k,) int) with those not in the table replaced by ``default_value``."""
        arr = _values(ids, "ids")
        _, out = self._call("valid_sample_ids", {}, {"ids": arr})
        result = np.where(out["found"], arr.astype(np.int64), np.int64(_as_int64(default_value)))
        return torch.from_numpy(result)

    @staticmethod
    def combine_vector_with_sample_counts(
        origin: torch.Tensor | np.ndarray,
        sample_cnts: int | torch.Tensor | np.ndarray,
        sampled: torch.Tensor | np.ndarray,
    ) -> torch.Tensor:
        """Each positive followed by its negatives.

        Example: ``origin=[1, 2, 3]``, ``sample_cnts=2``, ``sampled=[5, 6, 7, 8, 9, 10]``
        gives ``[1, 5, 6, 2, 7, 8, 3, 9, 10]``.

        Args:
            origin: (b,) positives; sample_cnts: (b,) or one int; sampled: (sum(cnts),).

        Returns:
            (b + sum(cnts),) with ``origin``'s dtype.
        """
        pos = _values(origin, "origin")
        cnts = _counts(sample_cnts, len(pos))
        neg = _values(sampled, "sampled")
        if len(neg) != int(cnts.sum()):
            raise BadRequest(f"sampled has {len(neg)} ids but sample_cnts sum to {int(cnts.sum())}")
        out = np.empty(len(pos) + len(neg), dtype=np.result_type(pos.dtype, neg.dtype))
        pos_at = (
            np.arange(len(pos)) + np.concatenate([[0], np.cumsum(cnts)[:-1]]).astype(np.int64)
            if len(pos)
            else np.zeros(0, np.int64)
        )
        is_pos = np.zeros(len(out), bool)
        is_pos[pos_at] = True
        out[pos_at] = pos
        out[~is_pos] = neg
        return torch.from_numpy(out)

    def pack_feature(
        self, ids: torch.Tensor | np.ndarray, default_value: int
    ) -> dict[str, torch.Tensor | RaggedTensor]:
        """Every column of the table for ``ids`` ((k,) int), one row per id, in order.

        Dense columns come back as (k,) tensors, ragged ones as RaggedTensor, string columns
        as RaggedTensor of UTF-8 bytes (uint8). An id not in the table gets the row of
        ``default_value`` if that id is in the table, else zeros / empty rows (with
        ``default_value`` in the dedup column).
        """
        arr = _values(ids, "ids")
        meta, out = self._call("pack_feature", {"default_value": int(default_value)}, {"ids": arr})
        columns = decode_columns(meta.get("columns"), out)
        return {name: col.to_user() for name, col in columns.items()}

    def combine(
        self,
        batch: Any,
        output_sample_table: Mapping[str, Any],
        sample_counts: int | torch.Tensor | np.ndarray,
    ) -> Any:
        """Expands a positive batch to positives + negatives, with a label column.

        ``batch`` is a RecIS batch (a list/tuple whose first element is a dict of feature
        name -> RaggedTensor or tensor, one row per positive) or such a dict. Columns of
        ``output_sample_table`` (from :meth:`pack_feature` on the ids of
        :meth:`combine_vector_with_sample_counts`) replace the batch's; every other
        (user-side) column repeats positive ``i``'s row ``1 + sample_counts[i]`` times. The
        label column (``label_name``) is 1.0 for positives and 0.0 for negatives (float32).
        Elements of ``batch`` after the first are passed through unchanged.
        """
        features = batch[0] if isinstance(batch, list | tuple) else batch
        if not isinstance(features, Mapping):
            raise BadRequest(f"batch[0] must be a dict of features, got {type(features).__name__}")
        if self.dedup_tag not in features:
            raise BadRequest(f"batch has no {self.dedup_tag!r} (dedup_tag) feature")
        n_pos = len(_values(features[self.dedup_tag], self.dedup_tag))
        cnts = _counts(sample_counts, n_pos)
        reps = torch.from_numpy(cnts + 1)
        total = int(reps.sum())
        rows = torch.repeat_interleave(torch.arange(n_pos), reps)
        out: dict[str, Any] = {}
        for name, value in features.items():
            if name in output_sample_table:
                continue
            out[name] = _repeat_rows(name, value, rows, n_pos)
        for name, value in output_sample_table.items():
            got = len(value) if isinstance(value, RaggedTensor) else int(value.shape[0])
            if got != total:
                raise BadRequest(
                    f"output_sample_table column {name!r} has {got} rows; "
                    f"positives + negatives = {total}"
                )
            out[name] = value
        label = torch.zeros(total, dtype=torch.float32)
        label[torch.cumsum(reps, 0) - reps] = 1.0
        out[self.label_name] = label
        if isinstance(batch, tuple):
            return (out, *batch[1:])
        if isinstance(batch, list):
            return [out, *batch[1:]]
        return out


def _idle_exit(default: float) -> float:
    """The idle exit an auto-started server gets: ``$STREAMREC_SAMPLER_IDLE_EXIT_S``, else
    ``default``."""
    raw = os.environ.get(IDLE_EXIT_ENV) or default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise BadRequest(f"{IDLE_EXIT_ENV} must be seconds >= 0, got {raw!r}")
    return value


def _values(x: Any, name: str) -> np.ndarray:
    """A RaggedTensor's values, or a 1-D tensor / array / list, as a numpy array."""
    if isinstance(x, RaggedTensor):
        x = x.values()
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise BadRequest(f"{name} must be 1-D (one value per positive), got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise BadRequest(f"{name} must hold integer ids, got dtype {arr.dtype}")
    return arr


def _counts(sample_cnts: Any, n: int) -> np.ndarray:
    if isinstance(sample_cnts, int | np.integer) and not isinstance(sample_cnts, bool):
        if sample_cnts < 0:
            raise BadRequest(f"sample_cnts must be >= 0, got {sample_cnts}")
        return np.full(n, int(sample_cnts), np.int64)
    cnts = _values(sample_cnts, "sample_cnts")
    if len(cnts) != n:
        raise BadRequest(f"sample_cnts has {len(cnts)} entries but there are {n} positives")
    if n and int(cnts.min()) < 0:
        i = int(np.argmin(cnts))
        raise BadRequest(f"sample_cnts[{i}] = {int(cnts[i])}: counts must be >= 0")
    return cnts.astype(np.int64)


def _as_int64(value: int) -> int:
    """A uint64 feasign above 2**63 keeps its bit pattern as a negative int64."""
    return int(np.array(value, np.uint64).astype(np.int64)) if value >= 1 << 63 else int(value)


def _repeat_rows(name: str, value: Any, rows: torch.Tensor, n_pos: int) -> Any:
    if isinstance(value, RaggedTensor):
        if len(value) != n_pos:
            raise BadRequest(f"batch feature {name!r} has {len(value)} rows, expected {n_pos}")
        return value.take_rows(rows)
    if isinstance(value, Column):
        value = value.to_user()
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    if tensor.dim() == 0 or tensor.shape[0] != n_pos:
        raise BadRequest(
            f"batch feature {name!r} has shape {tuple(tensor.shape)}, expected {n_pos} rows"
        )
    return tensor.index_select(0, rows)


def stop_server(pid: int, timeout_s: float = 10.0) -> None:
    """Stops a sampler server process by pid (SIGTERM, then SIGKILL after ``timeout_s``) and
    waits until it is gone. For tests and the demo."""
    stop_process(pid, timeout_s)
