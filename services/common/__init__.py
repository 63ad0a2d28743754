"""StreamRec: streaming DLRM training as microservices.

Shared code lives here (installed from ``services/common``): :mod:`streamrec.wire` (the
ZeroMQ protocol), :mod:`streamrec.ragged` (ragged batches), :mod:`streamrec.keyhash` (the
64-bit key hash that picks shards), :mod:`streamrec.config` (pydantic config base),
:mod:`streamrec.metrics` (Prometheus helpers) and :mod:`streamrec.errors`. Each service is a
subpackage: ``streamrec.sampler``, ``streamrec.embedding_store``, ``streamrec.trainer``,
``streamrec.api``.
"""

__version__ = "0.1.0"

import os as _os

# OpenMP threads that spin-wait (GNU libgomp's default) steal the cores that the other
# processes of a node (trainer ranks, store shards, sampler) need: measured on 2 cores, a
# small torch op went from ~16 us with passive waiting to ~1.9 ms with active waiting. Set
# before torch loads its OpenMP runtime; an explicit setting in the environment wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
