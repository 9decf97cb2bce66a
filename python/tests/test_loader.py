"""A loop over a DataLoader with worker processes saves the place it has consumed, not the
place the workers' prefetch has drawn to: resumed, it sees exactly the examples an
uninterrupted run would have seen next, in the same order, across epoch boundaries."""
import warnings

import pytest
import torch

import steadfast.torch as st
from steadfast._resume import ResumableLoader, ResumableSampler

SEED = 4


def dataset(n):
    # Each example is its own index: a batch shows which examples the loop received.
    return torch.utils.data.TensorDataset(torch.arange(n))


def loader(n, state=None, **options):
    sampler = ResumableSampler(n, seed=SEED)
    made = ResumableLoader(dataset(n), options.pop("batch_size", 10), sampler=sampler, **options)
    if state is not None:
        made.load_state_dict(state)
    return made


def epoch_batches(n, epoch, batch_size=10, drop_last=False, start=0):
    """What a loop receives in ``epoch`` from ``start`` on, computed from the order alone."""
    order = ResumableSampler(n, seed=SEED).order(epoch).tolist()[start:]
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    return [b for b in batches if len(b) == batch_size or not drop_last]


def received(iteration):
    return [b[0].tolist() for b in iteration]


@pytest.mark.parametrize("n,drop_last", [(100, False), (105, False), (105, True)])
@pytest.mark.parametrize("taken", [5, 9])
def test_a_loop_with_two_workers_resumes_at_the_batch_after_the_last_it_took(n, drop_last, taken):
    first = loader(n, num_workers=2, drop_last=drop_last)
    batches = iter(first)
    took = [next(batches)[0].tolist() for _ in range(taken)]
    saved = first.state_dict()
    # The workers have drawn up to 4 batches more (9 taken: the whole epoch); what is saved
    # is what the loop took, in the epoch the loop is in.
    assert saved["sampler"]["epoch"] == 0 and saved["sampler"]["position"] == taken * 10
    assert first.sampler.state_dict() == saved["sampler"]
    del batches, first

    resumed = loader(n, saved, num_workers=2, drop_last=drop_last)
    rest_of_epoch_0 = received(resumed)
    epoch_1 = received(resumed)
    assert took + rest_of_epoch_0 == epoch_batches(n, 0, drop_last=drop_last)
    assert epoch_1 == epoch_batches(n, 1, drop_last=drop_last)
    assert resumed.sampler.state_dict()["epoch"] == 2 and resumed.sampler.position == 0


def test_saved_after_the_last_batch_of_an_epoch_the_resumed_loop_ends_that_epoch_then_runs_the_next():
    first = loader(100, num_workers=2)
    batches = iter(first)
    for _ in range(10):
        next(batches)
    saved = first.state_dict()     # the loop's body of the last batch; the iteration has not ended
    assert (saved["sampler"]["epoch"], saved["sampler"]["position"]) == (0, 100)
    resumed = loader(100, saved, num_workers=2)
    assert received(resumed) == []                                  # as the uninterrupted loop: the end
    assert received(resumed) == epoch_batches(100, 1)


def test_a_plain_dataloader_with_workers_counts_the_prefetch_and_is_warned_about():
    sampler = ResumableSampler(100, seed=SEED)
    plain = torch.utils.data.DataLoader(dataset(100), batch_size=10, sampler=sampler, num_workers=2)
    with pytest.warns(UserWarning, match=r"ahead of the batches the loop has taken.*ResumableLoader"):
        batches = iter(plain)
    for _ in range(5):
        next(batches)
    assert sampler.state_dict()["position"] == 90   # 50 taken: a resume would skip 40
    del batches
    # Without workers it is exact, and not warned about.
    sampler = ResumableSampler(100, seed=SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = iter(torch.utils.data.DataLoader(dataset(100), batch_size=10, sampler=sampler))
        for _ in range(5):
            next(batches)
    assert sampler.state_dict()["position"] == 50


@pytest.mark.parametrize("persistent", [False, True])
def test_breaking_out_of_an_epoch_and_iterating_again_continues_after_the_last_batch_taken(persistent):
    loop = loader(100, num_workers=2, persistent_workers=persistent)
    took = []
    for b in loop:
        took.append(b[0].tolist())
        if len(took) == 3:
            break
    took += received(loop)                        # a new iter(loader): the rest of epoch 0
    assert took == epoch_batches(100, 0)
    assert received(loop) == epoch_batches(100, 1)


def test_without_workers_the_loader_is_a_plain_dataloader_that_counts():
    plain = torch.utils.data.DataLoader(dataset(105), batch_size=10, sampler=ResumableSampler(105, seed=SEED))
    counted = loader(105)
    assert received(counted) == received(plain) == epoch_batches(105, 0)
    assert received(counted) == received(plain) == epoch_batches(105, 1)
    batches = iter(counted)
    for _ in range(4):
        next(batches)
    assert counted.sampler.state_dict()["position"] == 40
    assert received(loader(105, counted.state_dict())) == epoch_batches(105, 2, start=40)


def test_a_loop_that_sets_the_epoch_at_each_epochs_start_resumes_mid_epoch():
    first = loader(100, num_workers=2)
    first.sampler.set_epoch(3)
    batches = iter(first)
    took = [next(batches)[0].tolist() for _ in range(2)]
    saved = first.state_dict()
    del batches
    resumed = loader(100, saved, num_workers=2)
    resumed.sampler.set_epoch(3)                  # the loop's own `sampler.set_epoch(epoch)`
    assert took + received(resumed) == epoch_batches(100, 3)
    resumed.sampler.set_epoch(5)
    assert received(resumed) == epoch_batches(100, 5)


class Seeds(torch.utils.data.Dataset):
    """Each example is the seed of the worker process that fetched it."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.initial_seed()


def test_the_loader_draws_worker_seeds_from_its_own_generator_and_saves_it():
    def make():
        return ResumableLoader(Seeds(), 10, sampler=ResumableSampler(40, seed=SEED), num_workers=2)

    def seeds_of(iteration):
        return [b.tolist() for b in iteration]

    before = torch.get_rng_state()
    whole = make()
    seeds = [seeds_of(whole) for _ in range(3)]
    assert torch.equal(torch.get_rng_state(), before)    # torch's global generator untouched
    # Interrupted in the second epoch and resumed: the third epoch's workers have the seeds
    # they had in the uninterrupted run.
    first = make()
    seeds_of(first)
    batches = iter(first)
    next(batches)
    saved = first.state_dict()
    del batches
    resumed = make()
    resumed.load_state_dict(saved)
    rest = seeds_of(resumed)
    assert set(sum(rest, [])) <= set(sum(seeds[1], []))
    assert seeds_of(resumed) == seeds[2]


def test_what_a_loader_cannot_count_is_refused():
    data = dataset(20)
    with pytest.raises(TypeError, match="ResumableSampler"):
        ResumableLoader(data, 5, sampler=torch.utils.data.SequentialSampler(data))
    sampler = ResumableSampler(20)
    with pytest.raises(ValueError, match="batch_sampler"):
        ResumableLoader(data, None, sampler=sampler, batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="in_order=False"):
        ResumableLoader(data, 5, sampler=sampler, num_workers=1, in_order=False)
    counted = ResumableLoader(data, 5, sampler=sampler)
    with pytest.raises(ValueError, match="another ResumableLoader"):
        ResumableLoader(data, 5, sampler=sampler)
    old = iter(counted)
    next(old)
    new = iter(counted)
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)
    assert next(new)[0].tolist() == ResumableSampler(20).order(0).tolist()[5:10]


def test_steadfast_torch_exports_the_loader():
    assert st.ResumableLoader is ResumableLoader and st.ResumableSampler is ResumableSampler
