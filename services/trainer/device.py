"""Where a trainer rank's dense model runs: ``runner.device`` (a REST job's ``model.device``).

    runner.device   torch sees a GPU      torch sees none
    auto            cuda                  cpu
    cuda            cuda                  ConfigError naming runner.device, at start
    cpu             cpu                   cpu

A rank takes the GPU of its ``LOCAL_RANK`` (modulo the GPUs torch sees), so the ranks of one
node spread over its GPUs. ``distributed.backend: auto`` then joins the ranks with nccl on
cuda and gloo on cpu (:func:`~.distributed.init_from_env`); ``nccl`` with ``runner.device: cpu``
is refused when the config is parsed.
"""

from __future__ import annotations

import os

import torch
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.errors import ConfigError

#: the settings of ``runner.device``
DEVICES = ("auto", "cpu", "cuda")


def resolve_device(
    setting: str, gpus: int | None = None, local_rank: int | None = None
) -> torch.device:
    """The device a ``runner.device`` setting gives this rank.

    Args:
        setting: auto, cpu or cuda.
        gpus: CUDA GPUs torch sees (None: ``torch.cuda.device_count()`` where
            ``torch.cuda.is_available()``, else 0).
        local_rank: this rank's index on its node (None: ``$LOCAL_RANK``, else 0).

    Raises:
        ConfigError: ``cuda`` where there is no GPU; a setting not in :data:`DEVICES`.
    """
    if setting not in DEVICES:
        raise ConfigError(f"runner.device must be one of {DEVICES}, got {setting!r}")
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if setting == "cpu" or (setting == "auto" and gpus == 0):
        return torch.device("cpu")
    if gpus == 0:
        raise ConfigError(
            f"runner.device {setting!r}: torch {torch.__version__} sees no CUDA GPU here "
            f"(torch built for CUDA {torch.version.cuda or 'none'}); set runner.device cpu "
            f"or auto, or run the trainer where a GPU is"
        )
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    return torch.device("cuda", local_rank % gpus)


def config_device(config: TrainerConfig) -> torch.device:
    """:func:`resolve_device` of a job's ``runner.device``; on cuda, that GPU becomes the
    process's current one (what nccl and the caching allocator use)."""
    device = resolve_device(config.runner.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device
