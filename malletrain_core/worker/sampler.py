"""A batch sampler with one global sample cursor, so that data positions survive rescaling.

The data is one endless stream: data epoch ``e`` is a seeded permutation of the dataset, and
stream position ``p`` is sample ``perm_{p // N}[p % N]``. Each optimiser step takes the next
global batch of ``G`` consecutive positions and splits it across the current ranks in
contiguous slices whose sizes differ by at most one, so ``G`` need not be a multiple of the
world size and ``N`` need not be a multiple of ``G`` (a batch may span two data epochs). The
state is one integer, the global cursor, equal on every rank: saved at world size ``W`` and
loaded at ``W'``, the next batch starts exactly where the saved one ended, so no sample is
skipped and none is repeated among the updates that survive.

Per-rank state (torch's ``DistributedSampler``, torchdata's ``StatefulDistributedSampler``)
cannot do this: each rank's position is an offset into a stride that depends on ``W``.

A data loader with workers fetches batches ahead of training. The saved cursor is therefore
the end of the last batch *trained*: :meth:`ElasticSampler.mark_trained` (called by
:class:`~malletrain_core.worker.elastic.Run` after each step) moves it; a script that never calls
it saves the end of the last batch handed out, which is the same with ``num_workers=0``.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sized
from typing import Any

from ..errors import MalleTrainError

STATE_VERSION = 1


def rank_slice(batch: int, world: int, rank: int) -> tuple[int, int]:
    """(start, stop) of ``rank``'s share of a global batch of ``batch`` positions."""
    return batch * rank // world, batch * (rank + 1) // world


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    return int(text) if text.strip() else default


class ElasticSampler:
    """Dataset indices for one rank, from a global cursor shared by every rank.

    Either ``batch_size`` (per rank: the global batch is ``batch_size × world_size``; scale
    the learning rate yourself) or ``global_batch`` (fixed whatever the world size) must be
    given. With ``batch_size`` it replaces ``DistributedSampler`` as it is:
    ``DataLoader(dataset, batch_size=B, sampler=sampler)``; with a ``global_batch`` that the
    world size may not divide, use :class:`ElasticBatchSampler` as ``batch_sampler=``.
    ``set_epoch(e)`` then iterating yields the batches that start in data epoch ``e``; epochs
    already behind the cursor (after a resume) yield nothing: start the epoch loop at
    :attr:`data_epoch`.
    """

    def __init__(self, dataset: Sized | int, global_batch: int | None = None,
                 batch_size: int | None = None, seed: int = 0, world_size: int | None = None,
                 rank: int | None = None, shuffle: bool = True) -> None:
        self.num_samples = dataset if isinstance(dataset, int) else len(dataset)
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else int(world_size)
        self.rank = _env_int("RANK", 0) if rank is None else int(rank)
        if (global_batch is None) == (batch_size is None):
            raise MalleTrainError("ElasticSampler: give exactly one of global_batch= (fixed) "
                                  "or batch_size= (per rank)")
        self.per_rank_batch = int(batch_size) if batch_size is not None else None
        """Set: the global batch follows the world size (in-process rescaling keeps it so)."""
        self.global_batch = int(global_batch) if global_batch is not None \
            else int(batch_size) * self.world_size  # type: ignore[arg-type]
        if self.num_samples < 1:
            raise MalleTrainError("ElasticSampler: the dataset is empty")
        if not 0 <= self.rank < self.world_size:
            raise MalleTrainError(f"ElasticSampler: rank {self.rank} outside world size "
                                  f"{self.world_size}")
        if self.global_batch < self.world_size:
            raise MalleTrainError(f"ElasticSampler: global batch {self.global_batch} is smaller "
                                  f"than the world size {self.world_size}; every rank needs a "
                                  "sample (raise global_batch)")
        self.seed = int(seed)
        self.shuffle = shuffle
        self.cursor = 0
        self.epoch: int | None = None
        self.last_batch: tuple[int, int] = (0, 0)
        """The global positions [start, stop) of the last batch handed out."""
        self.trained: int | None = None
        self._handed: deque[int] = deque()
        self._perm_epoch = -1
        self._perm: list[int] = []

    # ----- the stream ------------------------------------------------------------------------
    @property
    def data_epoch(self) -> int:
        """The data epoch the cursor is in."""
        return self.cursor // self.num_samples

    def _permutation(self, epoch: int) -> list[int]:
        if epoch != self._perm_epoch:
            if self.shuffle:
                import torch
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._perm = torch.randperm(self.num_samples, generator=g).tolist()
            else:
                self._perm = list(range(self.num_samples))
            self._perm_epoch = epoch
        return self._perm

    def indices(self, start: int, stop: int) -> list[int]:
        """Dataset indices at stream positions [start, stop)."""
        out: list[int] = []
        pos = start
        while pos < stop:
            epoch, offset = divmod(pos, self.num_samples)
            take = min(stop - pos, self.num_samples - offset)
            out.extend(self._permutation(epoch)[offset:offset + take])
            pos += take
        return out

    def rank_batch(self, start: int) -> tuple[int, int]:
        """This rank's stream positions of the global batch starting at ``start``."""
        lo, hi = rank_slice(self.global_batch, self.world_size, self.rank)
        return start + lo, start + hi

    @property
    def loss_weight(self) -> float:
        """Multiply this rank's mean loss by it so that DDP's average of the ranks' gradients
        is the gradient of the global batch's mean loss (shares may differ by one sample)."""
        lo, hi = rank_slice(self.global_batch, self.world_size, self.rank)
        return self.world_size * (hi - lo) / self.global_batch

    # ----- the sampler protocol --------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:  # type: ignore[override]
        if self.global_batch % self.world_size:
            raise MalleTrainError(f"a global batch of {self.global_batch} does not split evenly "
                                  f"over {self.world_size} ranks: give ElasticBatchSampler as "
                                  "DataLoader(batch_sampler=...) instead of sampler=")
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[int]]:
        """This rank's share of each global batch that starts in the current data epoch."""
        epoch = self.data_epoch if self.epoch is None else self.epoch
        end = (epoch + 1) * self.num_samples
        while self.cursor < end:
            start = self.cursor
            lo, hi = self.rank_batch(start)
            self.cursor = start + self.global_batch
            self.last_batch = (start, self.cursor)
            self._handed.append(self.cursor)
            if len(self._handed) > 4096:
                self._handed.popleft()
            yield self.indices(lo, hi)
        self.epoch = None

    def num_batches(self) -> int:
        """Global batches left in the current data epoch."""
        epoch = self.data_epoch if self.epoch is None else self.epoch
        left = (epoch + 1) * self.num_samples - self.cursor
        return max(0, -(-left // self.global_batch))

    def __len__(self) -> int:
        lo, hi = rank_slice(self.global_batch, self.world_size, self.rank)
        return self.num_batches() * (hi - lo)

    def mark_trained(self, batches: int = 1) -> int:
        """The oldest ``batches`` batches handed out were trained; returns the global samples
        they held."""
        done = 0
        for _ in range(batches):
            if self._handed:
                self.trained = self._handed.popleft()
                done += 1
        return done * self.global_batch

    @property
    def trained_batch(self) -> tuple[int, int]:
        """Global positions [start, stop) of the last batch marked trained."""
        stop = self.saved_cursor
        return stop - self.global_batch, stop

    @property
    def saved_cursor(self) -> int:
        """What a checkpoint saves: the end of the last batch trained (or handed out)."""
        return self.cursor if self.trained is None else self.trained

    # ----- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "cursor": self.saved_cursor, "seed": self.seed,
                "num_samples": self.num_samples, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state.get("version", 0)) != STATE_VERSION:
            raise MalleTrainError(f"sampler state of version {state.get('version')!r}; this "
                                  f"MalleTrain reads version {STATE_VERSION}")
        if int(state["num_samples"]) != self.num_samples:
            raise MalleTrainError(f"the checkpoint's sampler saw {int(state['num_samples'])} "
                                  f"samples, this dataset has {self.num_samples}: resume with "
                                  "the same dataset or start a new checkpoint folder")
        self.cursor = int(state["cursor"])
        self.trained = None
        self._handed.clear()
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self._perm_epoch = -1
        self.epoch = None


class ElasticBatchSampler(ElasticSampler):
    """:class:`ElasticSampler` yielding this rank's batch as a list, for
    ``DataLoader(dataset, batch_sampler=...)``: ranks' shares may differ by one sample."""

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        return self.batches()

    def __len__(self) -> int:
        return self.num_batches()
