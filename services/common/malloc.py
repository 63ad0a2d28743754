"""Keeps freed memory in the process (glibc ``mallopt``), so per-step buffers do not fault.

A training step allocates and frees the same large buffers every time: a 25 MB pull reply,
the gathered rows, the summed gradients. glibc gives a freed chunk back to the kernel once
the free space at the top of the heap passes ``M_TRIM_THRESHOLD`` (by default twice the
last large chunk, so two freed replies are enough), and the next step's allocation then
takes a page fault per 4 KiB: measured on this project's 2-core VM, 6,200 faults and ~4 ms
for one 25.6 MB buffer, more than the copy into it. Raising the trim threshold and fixing
the mmap threshold at glibc's largest (32 MiB) makes those buffers come from a heap that
keeps its pages. The cost is resident memory the process has used before, which a service
sized for its peak step holds anyway.

This covers what comes from the heap (ZeroMQ's received frames, torch ops). The embedding
store's own per-step results come from its C++ buffer pool instead (``step_buffer`` in
``csrc/cpu/buffer_pool.cpp``), because long-lived allocations between them (cached routes)
fragment even a heap that keeps its pages.

``STREAMREC_KEEP_FREED_MEMORY=0`` leaves the allocator alone (and turns that pool off). Other
C libraries: a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: bytes of free heap top kept before giving any back to the kernel
TRIM_THRESHOLD = 1 << 30
#: chunks this large or larger are mapped afresh each time (glibc's upper bound)
MMAP_THRESHOLD = 32 << 20

_done = False
_lock = threading.Lock()


def keep_freed_memory() -> bool:
    """Applies the settings once per process; returns whether they are in effect."""
    global _done
    with _lock:
        if _done:
            return True
        if os.environ.get("STREAMREC_KEEP_FREED_MEMORY", "1") == "0":
            return False
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
            mallopt = getattr(libc, "mallopt", None)
        except OSError:
            mallopt = None
        if mallopt is None:
            return False
        _done = bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(
            mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        )
        return _done
