"""The global-cursor sampler: no sample skipped or repeated across world-size changes."""

from __future__ import annotations

import pytest

from malletrain_core.errors import MalleTrainError
from malletrain_core.worker.sampler import ElasticBatchSampler, ElasticSampler, rank_slice

pytest.importorskip("torch")


def ranks(n: int, world: int, **kw: object) -> list[ElasticBatchSampler]:
    return [ElasticBatchSampler(n, world_size=world, rank=r, **kw) for r in range(world)]  # type: ignore[arg-type]


def test_rank_slices_tile_the_batch_when_the_world_does_not_divide_it() -> None:
    for batch in range(3, 20):
        for world in range(1, batch + 1):
            cuts = [rank_slice(batch, world, r) for r in range(world)]
            assert cuts[0][0] == 0 and cuts[-1][1] == batch
            assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
            assert max(b - a for a, b in cuts) - min(b - a for a, b in cuts) <= 1


def run_steps(samplers: list[ElasticBatchSampler], steps: int) -> list[list[int]]:
    """``steps`` global steps (a new data epoch when one ends); each step's indices over all
    ranks, in rank order."""
    iters = [iter(s) for s in samplers]
    out = []
    for _ in range(steps):
        batch: list[int] = []
        for r, s in enumerate(samplers):
            got = next(iters[r], None)
            if got is None:
                iters[r] = iter(s)
                got = next(iters[r])
            batch.extend(got)
        for s in samplers:
            s.mark_trained()
        out.append(batch)
    return out


def test_save_at_2_resume_at_3_then_1_skips_and_repeats_nothing() -> None:
    n, g = 53, 7   # neither 2 nor 3 divides 7; 7 does not divide 53
    trained: list[list[int]] = []
    state = None
    # (world, steps kept, steps lost after the checkpoint: re-trained by the next phase)
    for world, kept, lost in ((2, 9, 3), (3, 11, 2), (1, 10, 0), (3, 8, 4)):
        samplers = ranks(n, world, global_batch=g, seed=5)
        if state is not None:
            for s in samplers:
                s.load_state_dict(state)
        trained += run_steps(samplers, kept)
        states = [s.state_dict() for s in samplers]
        assert all(st == states[0] for st in states), "ranks disagree on the sampler state"
        state = states[0]
        run_steps(samplers, lost)   # trained, then lost with the epoch (never saved)
    flat = [i for batch in trained for i in batch]
    assert all(len(batch) == g for batch in trained)
    assert len(flat) == 38 * g == state["cursor"]
    for epoch in range(len(flat) // n):
        assert sorted(flat[epoch * n:(epoch + 1) * n]) == list(range(n)), f"data epoch {epoch}"
    tail = flat[(len(flat) // n) * n:]
    assert len(set(tail)) == len(tail)


def test_data_epochs_are_seeded_permutations_and_differ() -> None:
    (s,) = ranks(20, 1, global_batch=20, seed=1)
    s.set_epoch(0)
    e0 = [i for b in s for i in b]
    s.set_epoch(1)
    e1 = [i for b in s for i in b]
    (t,) = ranks(20, 1, global_batch=20, seed=1)
    t.set_epoch(0)
    assert e0 == [i for b in t for i in b]
    assert sorted(e0) == sorted(e1) == list(range(20)) and e0 != e1


def test_epoch_loop_after_resume_skips_finished_epochs() -> None:
    first = ranks(10, 2, batch_size=2)
    run_steps(first, 4)                      # 16 positions: epoch 0 done, epoch 1 at 6
    resumed = ranks(10, 1, batch_size=2)     # per-rank batch: the global batch is now 2
    resumed[0].load_state_dict(first[0].state_dict())
    per_epoch = []
    for epoch in range(3):
        resumed[0].set_epoch(epoch)
        per_epoch.append(sum(len(b) for b in resumed[0]))
    assert per_epoch == [0, 4, 10]


def test_prefetched_batches_are_not_saved_as_trained() -> None:
    (s,) = ranks(30, 1, global_batch=4)
    it = iter(s)
    for _ in range(5):                       # a loader fetched five batches ahead
        next(it)
    assert s.mark_trained() == 4 and s.mark_trained() == 4
    assert s.state_dict()["cursor"] == 8


def test_bad_arguments_get_one_line_errors() -> None:
    with pytest.raises(MalleTrainError, match="exactly one of"):
        ElasticSampler(10, world_size=1, rank=0)
    with pytest.raises(MalleTrainError, match="smaller than the world size"):
        ElasticSampler(10, global_batch=2, world_size=3, rank=0)
    s = ElasticSampler(10, global_batch=2, world_size=1, rank=0)
    with pytest.raises(MalleTrainError, match="same dataset"):
        s.load_state_dict(ElasticSampler(11, global_batch=2, world_size=1, rank=0).state_dict())


def test_as_a_plain_sampler_with_a_per_rank_batch_size() -> None:
    from torch.utils.data import DataLoader

    data = list(range(23))
    got: list[int] = []
    state = None
    for world, steps in ((2, 3), (3, 2)):   # the second phase ends past data epoch 0
        samplers = ranks(23, world, batch_size=2)
        loaders = []
        for r in range(world):
            s = ElasticSampler(23, batch_size=2, world_size=world, rank=r)
            if state is not None:
                s.load_state_dict(state)
            samplers[r] = s  # type: ignore[call-overload]
            loaders.append(iter(DataLoader(data, batch_size=2, sampler=s)))
        for _ in range(steps):
            for it in loaders:
                got += next(it).tolist()
            for s in samplers:
                s.mark_trained()
        state = samplers[0].state_dict()
    assert len(got) == 3 * 4 + 2 * 6 == state["cursor"]
    assert sorted(got[:23]) == data
    uneven = ElasticSampler(10, global_batch=5, world_size=2, rank=0)
    with pytest.raises(MalleTrainError, match="ElasticBatchSampler"):
        next(iter(uneven))
