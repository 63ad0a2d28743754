"""The frames of a StreamRec message: what every service sends over ZeroMQ.

A message is a ZeroMQ multipart message: one small header frame, then one raw frame per
array. Nothing is ever pickled: a peer's bytes are untrusted, so the header is msgpack of
plain types and the arrays are raw buffers whose dtype comes from a whitelist::

    frame 0   header (msgpack map)
              {"v": 1, "op": "sample_ids", "id": 7,
               "meta": {...plain values...},
               "arrays": [["keys", "<i8", [4096]], ["cnts", "<i4", [4096]]]}
    frame 1   4096 * 8 bytes   (keys)
    frame 2   4096 * 4 bytes   (cnts)

A reply has the same shape; its header carries ``"ok": true`` or ``"ok": false, "error":
{"code": ..., "message": ...}`` instead of an op. Error messages quote at most a bounded
prefix of a bad value (:func:`streamrec.errors.quote`) and are capped at
``MAX_ERROR_CHARS``. ``MAX_FRAMES`` caps the frame count, ``max_message_bytes`` the sum of
the frames.

The endpoints that send and receive these frames (peer auth, timeouts, worker threads) are
:mod:`streamrec.wire`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq
from streamrec.errors import BadRequest, quote

PROTOCOL_VERSION = 1
MAX_FRAMES = 256
#: Most dimensions of an array on the wire (numpy's own limit is 64).
MAX_DIMS = 32
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
#: Largest header frame a server decodes (plain metadata; arrays travel in their own frames).
MAX_HEADER_BYTES = 16 << 20
#: An error reply's message is cut to this many characters.
MAX_ERROR_CHARS = 2000
#: Frames smaller than this are copied on send; larger ones are sent zero-copy.
ZERO_COPY_THRESHOLD = 64 * 1024

#: The only dtypes that may cross the wire (little-endian, fixed size, no objects).
ALLOWED_DTYPES = {
    np.dtype(t).str: np.dtype(t)
    for t in (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
    )
}

Arrays = dict[str, np.ndarray]
Meta = dict[str, Any]
Handler = Callable[[Meta, Arrays], tuple[Meta, Arrays]]


@dataclass
class Message:
    """A decoded message: header fields, plain metadata and named arrays."""

    header: dict[str, Any]
    meta: Meta = field(default_factory=dict)
    arrays: Arrays = field(default_factory=dict)


def _as_wire_array(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if arr.dtype.str not in ALLOWED_DTYPES:
        if arr.dtype.byteorder == ">" and arr.dtype.newbyteorder("<").str in ALLOWED_DTYPES:
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        else:
            raise BadRequest(f"array {name!r}: dtype {arr.dtype} cannot cross the wire")
    # Contiguity is checked before sending: only C-contiguous buffers go out as-is.
    return np.ascontiguousarray(arr)


def encode(header: dict[str, Any], meta: Meta | None, arrays: Mapping[str, Any] | None) -> list:
    """Builds the frames of one message (header first, then one buffer per array)."""
    arrays = arrays or {}
    if len(arrays) + 1 > MAX_FRAMES:
        raise BadRequest(f"too many arrays: {len(arrays)} (at most {MAX_FRAMES - 1})")
    descriptors = []
    buffers = []
    for name, value in arrays.items():
        arr = _as_wire_array(name, value)
        descriptors.append([name, arr.dtype.str, list(arr.shape)])
        buffers.append(arr)
    head = dict(header, v=PROTOCOL_VERSION, meta=meta or {}, arrays=descriptors)
    try:
        packed = msgpack.packb(head, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. an int beyond 64 bits
        raise BadRequest(f"metadata cannot be encoded: {exc}") from exc
    return [packed, *buffers]


def frame_bytes(frame: Any) -> memoryview:
    """The bytes of a received frame (a ``zmq.Frame``) or of one to send, not copied."""
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return memoryview(frame)


def decode(frames: list, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Message:
    """Parses and validates untrusted frames into a :class:`Message`.

    Raises:
        BadRequest: naming what is wrong (header, descriptor, size, dtype).
    """
    if not frames:
        raise BadRequest("empty message")
    if len(frames) > MAX_FRAMES:
        raise BadRequest(f"too many frames: {len(frames)} (at most {MAX_FRAMES})")
    views = [frame_bytes(f) for f in frames]
    total = sum(v.nbytes for v in views)
    if total > max_message_bytes:
        raise BadRequest(f"message of {total} bytes exceeds the cap of {max_message_bytes}")
    return decode_body(decode_header(views[0]), views[1:])


def decode_header(frame: Any, max_bytes: int | None = None) -> dict[str, Any]:
    """The header frame as a map, nothing else checked (the body is :func:`decode_body`'s).

    Raises:
        BadRequest: the frame is larger than ``max_bytes``, not msgpack, or not a map.
    """
    view = frame_bytes(frame)
    if max_bytes is not None and view.nbytes > max_bytes:
        raise BadRequest(f"header frame of {view.nbytes} bytes exceeds the cap of {max_bytes}")
    try:
        header = msgpack.unpackb(view, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise BadRequest(f"header is not valid msgpack: {exc}") from exc
    if not isinstance(header, dict):
        raise BadRequest(f"header must be a map, got {type(header).__name__}")
    return header


def decode_body(header: dict[str, Any], buffers: list) -> Message:
    """The message of a decoded ``header`` and its buffer frames (descriptors checked)."""
    views = [frame_bytes(f) for f in buffers]
    version = header.get("v")
    if version != PROTOCOL_VERSION:
        raise BadRequest(f"header field 'v': unsupported protocol version {quote(version)}")
    meta = header.get("meta", {})
    if not isinstance(meta, dict):
        raise BadRequest("header field 'meta' must be a map")
    descriptors = header.get("arrays", [])
    if not isinstance(descriptors, list):
        raise BadRequest("header field 'arrays' must be a list")
    if len(descriptors) != len(views):
        raise BadRequest(
            f"header describes {len(descriptors)} arrays but {len(views)} buffers came"
        )
    arrays: Arrays = {}
    for desc, view in zip(descriptors, views, strict=True):
        name, arr = _decode_array(desc, view)
        if name in arrays:
            raise BadRequest(f"array {quote(name)} appears twice")
        arrays[name] = arr
    return Message(header=header, meta=meta, arrays=arrays)


def _decode_array(desc: Any, view: memoryview) -> tuple[str, np.ndarray]:
    if not (isinstance(desc, list) and len(desc) == 3):
        raise BadRequest(f"array descriptor must be [name, dtype, shape], got {quote(desc)}")
    name, dtype_str, shape = desc
    if not isinstance(name, str):
        raise BadRequest(f"array name must be a string, got {quote(name)}")
    dtype = ALLOWED_DTYPES.get(dtype_str) if isinstance(dtype_str, str) else None
    if dtype is None:
        raise BadRequest(f"array {quote(name)}: dtype {quote(dtype_str)} is not allowed")
    if not (
        isinstance(shape, list)
        and len(shape) <= MAX_DIMS
        and all(type(d) is int and d >= 0 for d in shape)  # not bool: numpy refuses it
        # Python ints: no int64 wrap; numpy refuses any shape this large, even an empty one
        and math.prod(d or 1 for d in shape) * dtype.itemsize < 1 << 62
    ):
        raise BadRequest(f"array {quote(name)}: bad shape {quote(shape)}")
    expected = math.prod(shape) * dtype.itemsize
    if expected != view.nbytes:
        raise BadRequest(
            f"array {quote(name)}: shape {shape} of {dtype_str} needs {expected} bytes, "
            f"buffer has {view.nbytes}"
        )
    arr = np.frombuffer(view, dtype=dtype).reshape(shape) if expected else np.empty(shape, dtype)
    return name, arr


def error_reply(request_id: Any, code: str, message: str) -> list:
    """The frames of an error reply to ``request_id``, its message cut to MAX_ERROR_CHARS."""
    if len(message) > MAX_ERROR_CHARS:
        message = f"{message[:MAX_ERROR_CHARS]}... (message cut, {len(message)} chars)"
    return encode(
        {"id": request_id, "ok": False, "error": {"code": code, "message": message}}, None, None
    )
