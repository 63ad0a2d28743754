"""Node-local negative sampling server (RecIS ``LocalRpcDataSampler``).

``from streamrec.sampler import LocalRpcDataSampler`` is the client; ``prefetch`` overlaps
sampling with training; ``streamrec-sampler serve`` runs the server standalone.
"""

from streamrec.sampler.client import LocalRpcDataSampler
from streamrec.sampler.prefetch import Prefetcher, prefetch

__all__ = ["LocalRpcDataSampler", "Prefetcher", "prefetch"]
