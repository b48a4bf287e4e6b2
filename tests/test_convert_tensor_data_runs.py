"""What each process of a `--to ddp` conversion reads, when the data never passes through a
sampler: each rank runs the converted fixture under a probe that records what it read
(checked per rank, not by reading the code), two ranks forked as torchrun would start them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from running import FIXTURES_DIR, _check, run_ranks, run_script

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

pytestmark = pytest.mark.runs

PROBE = textwrap.dedent("""\
    # Run a script and write probe-<RANK>.json: the token ids every training forward of an
    # Embedding read, the first column of the rows every training forward of a Linear read,
    # the offsets every unseeded torch.randint drew, the samples every DataLoader yielded,
    # what Python's random.sample and random.randrange drew, and the sum of what each
    # torch.randn drew.
    import json
    import os
    import random
    import runpy
    import sys

    import torch
    from torch.utils.data import DataLoader

    seen = {"tokens": [], "rows": [], "offsets": [], "samples": [], "draws": [], "states": []}
    randn = torch.randn
    sample, randrange = random.sample, random.randrange


    def recording_randn(*args, **kwargs):
        drawn = randn(*args, **kwargs)
        seen["states"].append(round(float(drawn.sum()), 5))
        return drawn


    def recording_sample(population, k):
        drawn = sample(population, k)
        seen["draws"].append(repr(drawn))
        return drawn


    def recording_randrange(*args):
        drawn = randrange(*args)
        seen["draws"].append(drawn)
        return drawn
    embedding_forward, randint, loader_iter = torch.nn.Embedding.forward, torch.randint, DataLoader.__iter__


    def recording_forward(self, input):
        if torch.is_grad_enabled():
            seen["tokens"].append(input.tolist())
        return embedding_forward(self, input)


    linear_forward = torch.nn.Linear.forward


    def recording_linear(self, input):
        if torch.is_grad_enabled():
            seen["rows"].append([round(v, 5) for v in input.reshape(-1, input.shape[-1])[:, 0].tolist()])
        return linear_forward(self, input)


    def recording_randint(*args, **kwargs):
        drawn = randint(*args, **kwargs)
        if "generator" not in kwargs:
            seen["offsets"].append(drawn.tolist())
        return drawn


    def recording_iter(self):
        for batch in loader_iter(self):
            seen["samples"] += [[round(v, 5) for v in row] for row in batch[0].tolist()]
            yield batch


    torch.nn.Embedding.forward, torch.randint, DataLoader.__iter__ = recording_forward, recording_randint, recording_iter
    torch.nn.Linear.forward = recording_linear
    random.sample, random.randrange = recording_sample, recording_randrange
    torch.randn = recording_randn
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
    with open(f"probe-{os.environ.get('RANK', 0)}.json", "w") as f:
        json.dump(seen, f)
    """)


def _converted(name: str, folder: Path, target: str = "ddp") -> Path:
    source = (FIXTURES_DIR / name).read_text(encoding="utf-8")
    conversion = convert_source(source, ConvertOptions(target=target, amp="off"), name)
    assert not [s for s in conversion.log.skipped if s.wrong]
    script = folder / Path(name).name
    script.write_text(conversion.converted, encoding="utf-8")
    return script


def _ranks(name: str, args: tuple[str, ...], folder: Path, target: str = "ddp") -> list[dict]:
    (folder / "probe.py").write_text(PROBE)
    proc = run_ranks(folder / "probe.py", (_converted(name, folder, target), *args), folder)
    _check(proc, f"two ranks of {name}")
    return [json.loads((folder / f"probe-{rank}.json").read_text()) for rank in (0, 1)]


def _original(name: str, args: tuple[str, ...], folder: Path) -> dict:
    (folder / "probe.py").write_text(PROBE)
    proc = run_script(folder / "probe.py", (FIXTURES_DIR / name, *args), folder)
    _check(proc, f"{name}")
    return json.loads((folder / "probe-0.json").read_text())


def test_batchify_ranks_read_disjoint_columns_that_make_up_the_batch(tmp_path):
    """Each step, rank 0 reads the first half of the original's streams and rank 1 the
    second: disjoint, together the original's batch, as many steps on each."""
    (tmp_path / "one").mkdir()
    original = _original("ddp/batchify_lm.py", (), tmp_path / "one")["tokens"]
    rank0, rank1 = (probe["tokens"] for probe in _ranks("ddp/batchify_lm.py", (), tmp_path))
    assert len(rank0) == len(rank1) == len(original) > 0
    for step, (whole, first, second) in enumerate(zip(original, rank0, rank1)):
        assert [len(row) for row in first] == [len(row) for row in second] == [2] * len(whole), step
        assert [a + b for a, b in zip(first, second)] == whole, step


def test_permuted_rows_ranks_read_disjoint_rows_in_as_many_steps(tmp_path):
    """fixtures/ddp/permuted_batches.py (was refused: "takes its batches from `train_x`"): 55
    rows, a batch of 8 on 2 ranks; in each epoch each rank reads its own 27 rows (ids in the
    first column, / 100) in 7 steps of at most 4, together all rows but the last."""
    rank0, rank1 = (probe["rows"] for probe in _ranks("ddp/permuted_batches.py", (), tmp_path))
    assert len(rank0) == len(rank1) == 2 * 7
    assert all(len(batch) <= 4 for batch in rank0 + rank1)
    for epoch in (slice(0, 7), slice(7, 14)):
        first, second = (
            [round(v * 100) for b in rank[epoch] for v in b] for rank in (rank0, rank1)
        )
        assert len(first) == len(set(first)) == len(second) == len(set(second)) == 27
        assert set(first) | set(second) == set(range(54))


def test_permuted_rows_one_process_trains_as_before(tmp_path):
    """Run with plain `python`, the converted fixture batches all rows as the original does."""
    name = "ddp/permuted_batches.py"
    converted, original = run_script(_converted(name, tmp_path)), run_script(FIXTURES_DIR / name)
    _check(converted, name)
    _check(original, name)
    assert converted.stdout == original.stdout != ""


def test_offset_ranks_read_alternate_batches_of_windows_that_make_up_the_epoch(tmp_path):
    """fixtures/ddp/offset_batches.py: 20 batches of 16 windows an epoch, 3 epochs. Each rank
    trains on 10 of them an epoch (the windows' first values, which the first Linear reads),
    none on both, together the original's. Before, both read all 20, and the proof passed it
    on their losses, which differed by the dropout alone."""
    name = "ddp/offset_batches.py"
    (tmp_path / "one").mkdir()
    first_layer = slice(0, None, 2)  # the rows of the first of the model's two Linears
    original = _original(name, (), tmp_path / "one")["rows"][first_layer]
    rank0, rank1 = (probe["rows"][first_layer] for probe in _ranks(name, (), tmp_path))
    assert len(original) == 3 * 20 and len(rank0) == len(rank1) == 3 * 10
    for epoch in range(3):
        mine, theirs = (
            sorted(v for batch in rank[epoch * 10 : epoch * 10 + 10] for v in batch)
            for rank in (rank0, rank1)
        )
        whole = sorted(v for batch in original[epoch * 20 : epoch * 20 + 20] for v in batch)
        assert not set(mine) & set(theirs)
        assert sorted(mine + theirs) == whole


def test_randint_ranks_draw_different_offsets_each_a_share_of_the_batch(tmp_path):
    rank0, rank1 = (probe["offsets"] for probe in _ranks("ddp/randint_lm.py", (), tmp_path))
    assert len(rank0) == len(rank1) == 40  # max_iters: as many steps on each
    assert all(len(draw) == 4 for draw in rank0 + rank1)  # batch_size 8 // 2 processes
    assert all(a != b for a, b in zip(rank0, rank1))


def test_iterable_stream_ranks_and_workers_read_disjoint_shares_of_all(tmp_path):
    """Two ranks with two DataLoader workers each: every sample once per epoch, on one
    rank (a worker replaying the stream would read samples twice)."""
    (tmp_path / "one").mkdir()
    everything = {
        tuple(s) for s in _original("ddp/iterable_stream.py", (), tmp_path / "one")["samples"]
    }
    assert len(everything) == 96
    rank0, rank1 = (
        [tuple(s) for s in probe["samples"]]
        for probe in _ranks("ddp/iterable_stream.py", ("--workers", "2"), tmp_path)
    )
    assert len(rank0) == len(rank1) == 96  # 2 epochs of 48: as many steps on each
    assert len(set(rank0)) == len(set(rank1)) == 48
    assert not set(rank0) & set(rank1)
    assert set(rank0) | set(rank1) == everything


@pytest.mark.parametrize(
    "name, target, draws",
    [
        ("ddp/replay_buffer.py", "ddp", 6 * 4),
        ("ddp/random_chunks.py", "ddp", 24 * 8),
        ("ddp/replay_buffer.py", "fsdp", 6 * 4),
    ],
)  # fmt: skip
def test_ranks_draw_their_own_minibatches_with_pythons_random(name, target, draws, tmp_path):
    """A replay buffer's `random.sample` and random chunk offsets: the two ranks take as
    many steps (each draws as often as the original), and draw other batches. Under FSDP
    the target network's copy of the sharded Q-network is whole on both ranks."""
    rank0, rank1 = (probe["draws"] for probe in _ranks(name, (), tmp_path, target))
    assert len(rank0) == len(rank1) == draws
    assert rank0 != rank1


def test_ranks_collect_their_own_rollouts_each_round(tmp_path):
    """fixtures/ddp/rollout_rounds.py (was refused as full-batch training): 6 rounds of
    new states on each rank, other ones on each."""
    rank0, rank1 = (probe["states"] for probe in _ranks("ddp/rollout_rounds.py", (), tmp_path))
    assert len(rank0) == len(rank1) == 6
    assert all(a != b for a, b in zip(rank0, rank1))


def test_a_loop_nothing_calls_leaves_the_loader_that_runs_sharded(tmp_path):
    """fixtures/ddp/unused_train_function.py (was refused as full-batch training): in each
    epoch the ranks read disjoint halves of the 128 samples."""
    probes = _ranks("ddp/unused_train_function.py", (), tmp_path)
    rank0, rank1 = ([tuple(s) for s in probe["samples"]] for probe in probes)
    assert len(rank0) == len(rank1) == 2 * 64
    for epoch in (slice(0, 64), slice(64, 128)):
        assert not set(rank0[epoch]) & set(rank1[epoch])
        assert len(set(rank0[epoch]) | set(rank1[epoch])) == 128
