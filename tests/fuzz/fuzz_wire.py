"""atheris target: :func:`streamrec.wire.decode` over frames built from arbitrary bytes.

Half the inputs are raw frames (the header frame is whatever bytes came); the other half pack
a header of fuzzed plain values with msgpack, so the fuzzer reaches the array descriptors
(names, dtypes, shapes with huge or negative sizes) and buffers that match or almost match.
``BadRequest`` is the decoder's documented refusal; any other exception is a crash, and so is
a decoded message whose arrays do not cover exactly the buffers that came.

    .venv/bin/python tests/fuzz/fuzz_wire.py -max_total_time=30 -rss_limit_mb=2048
"""

from __future__ import annotations

import sys

import atheris
import msgpack

with atheris.instrument_imports(include=["streamrec.wire"]):
    from streamrec import wire
from streamrec.errors import BadRequest

DTYPES = [*sorted(wire.ALLOWED_DTYPES), "|O", "<U4", ">i8", "V8", ""]
#: The largest frame a fuzzed input may ask for (keeps every run within -rss_limit_mb).
MAX_FRAME = 1 << 16


def _int(fdp: atheris.FuzzedDataProvider) -> int:
    """Any integer msgpack can carry: int64, or up to uint64's maximum."""
    return fdp.ConsumeInt(8) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 2**64 - 1)


def _value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> object:
    """A plain msgpack value: the kinds a header may hold, and some it may not."""
    kind = fdp.ConsumeIntInRange(0, 7 if depth < 3 else 4)
    if kind == 0:
        return _int(fdp)
    if kind == 1:
        return fdp.ConsumeUnicodeNoSurrogates(8)
    if kind == 2:
        return fdp.ConsumeBool()
    if kind == 3:
        return fdp.ConsumeRegularFloat()
    if kind == 4:
        return None
    if kind == 5:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    if kind == 6:
        return {
            fdp.ConsumeUnicodeNoSurrogates(4): _value(fdp, depth + 1)
            for _ in range(fdp.ConsumeIntInRange(0, 3))
        }
    return fdp.ConsumeBytes(8)


def _descriptor(fdp: atheris.FuzzedDataProvider) -> object:
    if fdp.ConsumeIntInRange(0, 7) == 0:
        return _value(fdp)
    shape: object = [
        _int(fdp) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 64)
        for _ in range(fdp.ConsumeIntInRange(0, 4))
    ]
    if fdp.ConsumeIntInRange(0, 7) == 0:
        shape = _value(fdp)
    name = fdp.ConsumeUnicodeNoSurrogates(4) if fdp.ConsumeIntInRange(0, 7) else _value(fdp)
    dtype = DTYPES[fdp.ConsumeIntInRange(0, len(DTYPES) - 1)]
    return [name, dtype, shape]


def frames_of(data: bytes) -> list[bytes]:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        n = fdp.ConsumeIntInRange(0, 6)
        return [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 256)) for _ in range(n)]
    descriptors = [_descriptor(fdp) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    header: dict[object, object] = {
        "v": wire.PROTOCOL_VERSION if fdp.ConsumeIntInRange(0, 7) else _value(fdp),
        "op": fdp.ConsumeUnicodeNoSurrogates(8),
        "id": fdp.ConsumeInt(4),
        "meta": {"k": _value(fdp)} if fdp.ConsumeIntInRange(0, 7) else _value(fdp),
        "arrays": descriptors if fdp.ConsumeIntInRange(0, 7) else _value(fdp),
    }
    buffers = []
    for _ in range(fdp.ConsumeIntInRange(0, 5)):
        size = fdp.ConsumeIntInRange(0, MAX_FRAME) if fdp.ConsumeBool() else 0
        if size and fdp.ConsumeBool():
            size = 8 * fdp.ConsumeIntInRange(0, 64)
        buffers.append(bytes(size))
    return [msgpack.packb(header, use_bin_type=True), *buffers]


def test_one_input(data: bytes) -> None:
    frames = frames_of(data)
    try:
        msg = wire.decode(frames, max_message_bytes=1 << 20)
    except BadRequest:
        return
    assert isinstance(msg.header, dict) and isinstance(msg.meta, dict)
    assert len(msg.arrays) == len(frames) - 1
    for arr, frame in zip(msg.arrays.values(), frames[1:], strict=True):
        assert arr.nbytes == len(frame), (arr.shape, arr.dtype, len(frame))
        assert arr.dtype.str in wire.ALLOWED_DTYPES


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
