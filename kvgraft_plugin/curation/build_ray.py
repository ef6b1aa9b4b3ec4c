"""``kvgraft build --ray``: entries built on Ray workers, the library written here.

Each worker is a Ray actor that loads the model once (a `GraftEngine` under the build's configuration)
and captures the entries it is handed, exactly as a local build does, bitwise check included. This
process receives each finished (record, state bytes) pair as it comes and writes it the way a local build
does: the state first (uploaded, for a URL), then the manifest. A worker killed midway loses only the
entry it was on; a rerun resumes from the last manifest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from kvgraft_plugin.core.config import EngineConfig
from kvgraft_plugin.curation.build import EntryBuilder, encode_entry
from kvgraft_plugin.library.library import EntryRecord
from kvgraft_plugin.library.template import Entry

__all__ = ["ray_entry_builder"]

logger = logging.getLogger(__name__)


class _Worker:
    """One model on one Ray worker."""

    def __init__(self, config: EngineConfig) -> None:
        from kvgraft_plugin.engine.engine import GraftEngine

        self.engine = GraftEngine(None, config=config)

    def build(self, entry: Entry, src_sha: str) -> tuple[EntryRecord, bytes]:
        return encode_entry(self.engine, entry, src_sha)


def ray_entry_builder(config: EngineConfig, *, workers: int) -> EntryBuilder:
    """An `EntryBuilder` over ``workers`` Ray actors, each with ``config.llama.n_threads`` CPUs (starts or
    joins a Ray instance: ``RAY_ADDRESS`` names a cluster)."""
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=config.llama.n_threads)(_Worker)

    def build(items: list[tuple[Entry, str]]) -> Iterator[tuple[EntryRecord, bytes]]:
        if not items:
            return
        from ray.util import ActorPool

        actors: list[Any] = [remote.remote(config) for _ in range(min(workers, len(items)))]
        try:
            pool = ActorPool(actors)
            yield from pool.map_unordered(lambda actor, item: actor.build.remote(*item), items)
        finally:
            for actor in actors:
                ray.kill(actor)

    return build
