"""StreamRec: streaming DLRM training as microservices.

Shared code lives here (installed from ``services/common``): :mod:`streamrec.wire` (the
ZeroMQ protocol), :mod:`streamrec.ragged` (ragged batches), :mod:`streamrec.keyhash` (the
64-bit key hash that picks shards), :mod:`streamrec.config` (pydantic config base),
:mod:`streamrec.metrics` (Prometheus helpers) and :mod:`streamrec.errors`. Each service is a
subpackage: ``streamrec.sampler``, ``streamrec.embedding_store``, ``streamrec.trainer``,
``streamrec.api``.
"""

__version__ = "0.1.0"
