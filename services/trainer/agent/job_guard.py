"""What a trainer group lets a job read from Redis make it do: paths under its own roots, the
sampler and the store shards only at addresses it was told of.

The API checks every job it stores (``streamrec.api.spec_checks``); a trainer config read
back from Redis is checked again here against the trainer's own flags, because Redis is a
second door: whoever can write a job's ``trainer_config`` there (a leaked password, a
misconfigured network) could otherwise make the trainer write checkpoints, and delete an
older ``<path>/<day>/<pass>``, anywhere it may write, or send the data-plane token to a
listener of their choosing (the store client and the sampler client both send it, in the
PLAIN handshake). Defence in depth: nothing in Redis is trusted more than a REST body.

    runner.model_save_path               under a --model-root
    runner.train_data_dir                under a --data-root
    negative_sampling.table_path         under a --data-root
    negative_sampling.endpoint           None (the node-local default) or a --sampler-endpoint
    store.endpoints[i]                   a --store-endpoint, or --store-endpoint-template
                                         with {shard} = 0 .. --store-shards - 1
    (a deleted job's namespace drop)     the same store endpoints (check_store_endpoints)
    online.redis_url                     None or an --online-redis-url
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streamrec.control.trainer_config import TrainerConfig
from streamrec.errors import EndpointRefused, quote
from streamrec.roots import confine, resolve_roots


def numbered_endpoints(template: str, shards: int) -> list[str]:
    """``template`` with ``{shard}`` replaced by 0 .. ``shards`` - 1 (a StatefulSet's shards,
    ``tcp://embedding-store-{shard}.embedding-store:5555``); a ValueError names the flag."""
    if "{shard}" not in template:
        raise ValueError(f"--store-endpoint-template {quote(template)} has no {{shard}}")
    if shards < 1:
        raise ValueError(f"--store-shards {shards}: at least 1 with --store-endpoint-template")
    return [template.replace("{shard}", str(k)) for k in range(shards)]


@dataclass(frozen=True)
class JobGuard:
    """The trainer's own limits on a job (``streamrec.trainer.agent`` flags).

    Args:
        model_roots / data_roots: where a job may write models / read data (resolved).
        sampler_endpoints: sampler addresses a job may name besides the node-local default.
        store_endpoints: the store shard addresses a job may name (none: only the
            in-process store); the peer token is sent to no other.
        online_redis_urls: serving Redis URLs a job may publish to.
        enforce: False when the trainer was given none of these flags (a local run, a test):
            nothing is checked (the agent warns at start-up). ``streamrec up`` and the
            manifests give them.
    """

    model_roots: Sequence[Path] = ()
    data_roots: Sequence[Path] = ()
    sampler_endpoints: Sequence[str] = ()
    online_redis_urls: Sequence[str] = ()
    store_endpoints: Sequence[str] = ()
    enforce: bool = field(default=False)

    @classmethod
    def from_flags(
        cls,
        model_roots: Sequence[str | os.PathLike[str]] = (),
        data_roots: Sequence[str | os.PathLike[str]] = (),
        sampler_endpoints: Sequence[str] = (),
        online_redis_urls: Sequence[str] = (),
        store_endpoints: Sequence[str] = (),
        store_endpoint_template: str | None = None,
        store_shards: int | None = None,
    ) -> JobGuard:
        """The guard of the agent's flags; ``store_endpoint_template`` and ``store_shards`` add
        the numbered shards to ``store_endpoints`` (set both or neither: a ValueError names
        the flag)."""
        if (store_endpoint_template is None) != (store_shards is None):
            raise ValueError("--store-endpoint-template and --store-shards are set together")
        stores = list(store_endpoints)
        if store_endpoint_template is not None and store_shards is not None:
            numbered = numbered_endpoints(store_endpoint_template, store_shards)
            stores += [e for e in numbered if e not in stores]
        return cls(
            resolve_roots(model_roots),
            resolve_roots(data_roots),
            tuple(sampler_endpoints),
            tuple(online_redis_urls),
            tuple(stores),
            enforce=bool(
                model_roots or data_roots or sampler_endpoints or online_redis_urls or stores
            ),
        )

    def check_store_endpoints(
        self, endpoints: Sequence[str], what: str = "store.endpoints"
    ) -> None:
        """Raises :class:`EndpointRefused` naming ``what[i]`` and the first endpoint that is not
        one of this trainer's store shards (before anything, the peer token, is sent to it)."""
        if not self.enforce:
            return
        allowed = self.store_endpoints
        for i, endpoint in enumerate(endpoints):
            if endpoint not in allowed:
                trusted = (
                    f"{len(allowed)} by --store-endpoint / --store-endpoint-template, the first "
                    f"{quote(allowed[0])}"
                    if allowed
                    else "none: no --store-endpoint, only the in-process store"
                )
                raise EndpointRefused(
                    f"field '{what}[{i}]': {quote(endpoint)} is not a store shard this trainer "
                    f"trusts ({trusted}); nothing is sent to it"
                )

    def shards_now(
        self, endpoints: Sequence[str], count: Callable[[str], int | None]
    ) -> list[str] | None:
        """The store shards a job goes on with after the store's shard count changed (its
        StatefulSet scaled, ``streamrec up --store-shards N`` after a stop): this trainer's
        trusted store endpoints, when the job lists the first M of them in shard order and
        shard 0 (``count``: its ``ping``) says the store has N = all of them, N != M. The job's
        checkpoint then loads resharded M -> N. None otherwise: the job's endpoints stand."""
        allowed = list(self.store_endpoints)
        common = min(len(endpoints), len(allowed))
        if not self.enforce or not common or len(endpoints) == len(allowed):
            return None
        if list(endpoints[:common]) != allowed[:common]:
            return None
        return allowed if count(allowed[0]) == len(allowed) else None

    def check(self, config: TrainerConfig) -> None:
        """Raises :class:`~streamrec.errors.PathRefused` or :class:`EndpointRefused` naming
        the first field of ``config`` outside this trainer's limits."""
        if not self.enforce:
            return
        r, ns = config.runner, config.negative_sampling
        confine("runner.model_save_path", r.model_save_path, self.model_roots)
        confine("runner.train_data_dir", r.train_data_dir, self.data_roots, "--data-root")
        if ns.enabled and ns.table_path:
            confine("negative_sampling.table_path", ns.table_path, self.data_roots, "--data-root")
        self.check_store_endpoints(config.store.endpoints)
        endpoint = config.negative_sampling.endpoint
        ns_on = config.negative_sampling.enabled
        if ns_on and endpoint is not None and endpoint not in self.sampler_endpoints:
            raise EndpointRefused(
                f"field 'negative_sampling.endpoint': {quote(endpoint)} is not a sampler "
                f"this trainer trusts (--sampler-endpoint: {list(self.sampler_endpoints)}); "
                f"unset, the node-local sampler is used"
            )
        url = config.online.redis_url
        if url is not None and url not in self.online_redis_urls:
            raise EndpointRefused(
                f"field 'online.redis_url': {quote(url)} is not a serving Redis this trainer "
                f"trusts (--online-redis-url)"
            )
