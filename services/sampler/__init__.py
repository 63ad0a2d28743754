"""Node-local negative sampling server (RecIS ``LocalRpcDataSampler``).

``from streamrec.sampler import LocalRpcDataSampler`` is the client; ``prefetch`` overlaps
sampling with training; ``streamrec-sampler serve`` runs the server standalone.
"""

from streamrec.sampler.client import LocalRpcDataSampler
from streamrec.sampler.config import ENDPOINT_ENV, MISSING_ITEM_ID
from streamrec.sampler.prefetch import Prefetcher, prefetch

__all__ = ["ENDPOINT_ENV", "MISSING_ITEM_ID", "LocalRpcDataSampler", "Prefetcher", "prefetch"]
