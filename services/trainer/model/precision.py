"""The dense model's arithmetic: fp32, or bf16 autocast where the hardware runs it fast.

bf16 runs the MLPs' and the interaction's products under ``torch.autocast``; the weights,
their gradients and the dense optimizer's state stay fp32 (autocast casts copies per op), and
the embeddings come from the store as fp32. ``auto`` picks bf16 only where it pays: a CPU with
AMX or AVX512-BF16 (oneDNN's bf16 kernels; elsewhere bf16 is emulated and slower than fp32), a
CUDA GPU of compute capability 8.0 or newer. fp32 is the model's arithmetic as it always was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

#: the settings of ``model.precision``
PRECISIONS = ("auto", "fp32", "bf16")
#: /proc/cpuinfo flags of a CPU whose bf16 products are faster than its fp32 ones
FAST_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class Precision:
    """What the trainer computes in (``fp32`` or ``bf16``) and why (for the pass log)."""

    name: str
    reason: str

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.name == "bf16" else None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo cannot be read)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def fast_bf16(device: torch.device, flags: set[str] | None = None) -> str | None:
    """Why bf16 is fast on ``device`` (a sentence), or None where it is not."""
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        if major >= 8 and torch.cuda.is_bf16_supported():
            return f"{torch.cuda.get_device_name(device)} computes bf16 natively"
        return None
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    have = [f for f in FAST_BF16_CPU_FLAGS if f in (cpu_flags() if flags is None else flags)]
    return f"the CPU has {', '.join(have)}" if have else None


def resolve(setting: str, device: torch.device, flags: set[str] | None = None) -> Precision:
    """The precision a ``model.precision`` setting gives on ``device``."""
    if setting not in PRECISIONS:
        raise ValueError(f"model.precision must be one of {PRECISIONS}, got {setting!r}")
    if setting == "fp32":
        return Precision("fp32", "set")
    if setting == "bf16":
        return Precision("bf16", "set")
    why = fast_bf16(device, flags)
    if why is None:
        return Precision("fp32", f"auto: bf16 is not fast on this {device.type}")
    return Precision("bf16", f"auto: {why}")


@contextlib.contextmanager
def compute_in(precision: Precision, device: torch.device) -> Iterator[None]:
    """The forward pass's context: autocast to bf16, or nothing (fp32)."""
    dtype = precision.autocast_dtype
    if dtype is None:
        yield
        return
    with torch.autocast(device.type, dtype=dtype):
        yield
