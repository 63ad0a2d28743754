"""Bounds of the trainer config's numeric settings.

Used where each field is defined (``runner_config``, ``model_config``, ``runtime_config``) and
by the REST job (``streamrec.api.models``) where it defines the same field, so the two agree.
Every number is strict (``"30"`` or ``true`` is refused; an int is a float). A bound is what
one trainer machine can hold or wait for: past it a job fails later, or never ends.
"""

from __future__ import annotations

#: Splits per pass: a day of 1-minute splits.
MAX_SPLITS_PER_PASS = 1440
#: Seconds between two looks for a split's donefile.
MAX_SLEEP_S = 3600.0
#: Seconds to wait for a pass's donefiles (a week; None waits forever).
MAX_DATA_WAIT_S = 7 * 86400.0
#: checkpoint_per_pass, save_delta_frequency: a save every N passes.
MAX_EVERY_PASSES = 10_000
#: Rows a batch: parsed, pulled and computed at once (26 slots x dim 16 of 2^20 rows is
#: 1.7 GiB of embeddings, each 512-wide layer 2 GiB of activations).
MAX_BATCH = 1 << 20
#: MiB a parse chunk: held as text and as parsed arrays, one per prefetched batch.
MAX_READ_CHUNK_MB = 1024.0
#: TCP's port range (0: any free port).
MAX_PORT = 65535
#: Width of an MLP layer (a 16384 x 16384 layer is 1 GiB of float32, its optimizer state more).
MAX_LAYER_WIDTH = 16384
#: Layers of an MLP.
MAX_LAYERS = 64
#: Dense learning rate: a larger step diverges with every optimizer here.
MAX_LEARNING_RATE = 100.0
#: Scheduler steps (warmup, decay): 10^12 steps is 30 years at 1000 steps a second.
MAX_STEPS = 10**12
#: A wbce label weight (>= 0: a negative one would invert the loss).
MAX_LOSS_WEIGHT = 1e6
#: numpy's RandomState takes 0 .. 2^32-1, and the top MLP is seeded with seed + 1.
MAX_SEED = 2**32 - 2
#: Seconds a store request waits for a shard (a save of many GiB too): a day, as
#: distributed.checkpoint_timeout_s.
MAX_STORE_TIMEOUT_S = 86400.0
#: Store shards a job lists.
MAX_ENDPOINTS = 1024
#: Ranks of a trainer group.
MAX_RANKS = 1024
#: torch intra-op threads of a rank.
MAX_THREADS = 256
#: 1 positive + negatives a sample.
MAX_SAMPLE_SIZE = 1024
#: Feature ids are 64-bit (PaddleRec's uint64 feasigns kept as int64 bit patterns).
MIN_KEY, MAX_KEY = -(2**63), 2**63 - 1
