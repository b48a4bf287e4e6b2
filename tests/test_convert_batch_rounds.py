"""`--to ddp` of training loops over batches that no DataLoader makes (a project batching
class, a generator method, a list of batches shuffled every epoch): every process makes the
same batches and trains on every WORLD_SIZE-th of them from its RANK (`ShardedBatches`),
and no process is re-seeded by its rank. The proof tells the batches apart by content
(`_batch_rounds`); what the ranks really read is in the runs tests at the end."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from textwrap import dedent

import pytest
from running import FIXTURES_DIR, _check, run_ranks, run_script

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.verify import _batch_rounds
from autoaccel.run.runner import Run

DDP = ConvertOptions(target="ddp", amp="off")


def convert(source: str, path: str = "train.py"):
    return convert_source(source, DDP, path)


def convert_fixture(name: str):
    path = FIXTURES_DIR / name
    return convert(path.read_text(encoding="utf-8"), str(path))


def wrong(conversion) -> list:
    return [s for s in conversion.log.skipped if s.wrong]


def test_a_project_batching_class_is_shared_where_it_is_made():
    """`batches` is only iterated and measured: the assignment holds this process's share,
    so `len(batches)` in the printed average counts it. `random` is seeded by the script:
    nothing is seeded, and nothing re-seeded by rank."""
    conversion = convert_fixture("ddp/project_batcher.py")
    assert not wrong(conversion)
    assert conversion.log.batch_rounds
    code = conversion.converted
    assert "    batches = ShardedBatches(BucketBatches(rows, batch_size=16))\n" in code
    assert "        for tokens, labels in batches:\n" in code
    assert "rounds = zip(*[iter(self.batches)] * WORLD_SIZE)" in code
    assert "manual_seed" not in code.split("if __name__")[0] and "+ RANK" not in code
    assert any(
        c.description.startswith("no process is re-seeded by its rank")
        for c in conversion.log.changes
    )


def test_a_list_of_batches_made_in_a_method_is_shared(tmp_path):
    """fixtures/ddp/shuffled_batch_list.py (SimGNN's shape): `fit()` prints, and trains
    through `self.process_batch()`: not a function that only writes (it returned early on
    rank 1: the other process waited forever)."""
    conversion = convert_fixture("ddp/shuffled_batch_list.py")
    assert not wrong(conversion)
    code = conversion.converted
    assert "            batches = ShardedBatches(self.create_batches())\n" in code
    assert "RANK != 0" not in code


GENERATOR_LOOP = dedent("""\
    import torch
    from data import Sampler
    dl = Sampler()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in dl.generate_data(batch_size=256):
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """)


def test_a_generator_call_is_shared_in_the_loop():
    """bprmf's `for u, i, j in dl.generate_data(batch_size=256):` (was refused): nothing to
    bind, the loop's iterable is wrapped. The script seeds nothing: torch and Python's
    `random` take rank 0's seed (a library's batches may shuffle with `random`, as
    torchtext's `BucketIterator` does: hyunwoongko/transformer, the tenth unseen set),
    NumPy's not (no module of the program imports it)."""
    conversion = convert(GENERATOR_LOOP)
    assert not wrong(conversion)
    code = conversion.converted
    assert "for x, y in ShardedBatches(dl.generate_data(batch_size=256)):\n" in code
    assert "    torch.manual_seed(shared_seed[0])\n    random.seed(shared_seed[0])\n" in code
    assert "import random\n" in code and "np.random" not in code


ITERATOR_PARAMETER = dedent("""\
    import torch
    from data import make_iterator


    def train(model, iterator, optimizer):
        epoch_loss = 0.0
        for i, (x, y) in enumerate(iterator):
            loss = (model(x) - y).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
            print(f"step {i / len(iterator):.0%}")
        return epoch_loss / len(iterator)


    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        print(train(model, make_iterator(), optimizer))
    """)


def test_the_count_of_batches_a_wrapped_loop_takes_is_its_share():
    """hyunwoongko/transformer (the tenth unseen set): `train(model, iterator, ...)` loops
    over its share of `iterator`, but divided its epoch's loss sum, and its progress, by
    `len(iterator)`, every batch: printed train loss half the original's on 2 processes."""
    code = convert(ITERATOR_PARAMETER).converted
    assert "    for i, (x, y) in enumerate(ShardedBatches(iterator)):\n" in code
    assert '        print(f"step {i / len(ShardedBatches(iterator)):.0%}")\n' in code
    assert "    return epoch_loss / len(ShardedBatches(iterator))\n" in code


def test_a_name_read_otherwise_is_shared_in_the_loop_below_enumerate_and_tqdm():
    """`batches[0]` reads the whole list: the loop's iterable, below `enumerate()` and a
    progress bar, takes the share instead. Unseeded `random`: every process takes rank 0's
    seed, so that all shuffle alike."""
    conversion = convert(dedent("""\
        import random
        import torch
        from tqdm import tqdm
        data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(12)]
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            batches = list(data)
            random.shuffle(batches)
            print(batches[0][0].shape)
            for i, (x, y) in enumerate(tqdm(batches)):
                loss = (model(x) - y).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        """))
    assert not wrong(conversion)
    code = conversion.converted
    assert "for i, (x, y) in enumerate(tqdm(ShardedBatches(batches), disable=RANK != 0)):" in code
    assert "    random.seed(shared_seed[0])\n" in code
    assert "    torch.manual_seed(shared_seed[0])\n" in code


def test_a_second_pass_changes_nothing():
    once = convert(GENERATOR_LOOP).converted
    assert convert(once).converted == once


# -- the proof's check ----------------------------------------------------------------------
def _run(*steps: list[str]) -> Run:
    return Run(record={"batch_prints": [list(s) for s in steps]}, returncode=0, log="")


def _rank(*steps: list[str]) -> dict:
    return {"batch_prints": [list(s) for s in steps]}


ORIGINAL = _run(["h", "a"], ["h", "b"], ["h", "c"], ["h", "d"])  # `h`: a hidden state


@pytest.mark.parametrize(
    "ranks, passed",
    [
        ([_rank(["h", "a"], ["h", "c"]), _rank(["h", "b"])], True),  # the original's 1st, 2nd
        ([_rank(["h", "c"]), _rank(["h", "d"])], True),  # later ones of the first rounds
        ([_rank(["h", "a"]), _rank(["h", "x"])], False),  # rank 1 shuffled its own way
        ([_rank(["h", "a"]), _rank(["h", "a"])], False),  # both on the same batch
        ([_rank(["z", "a"]), _rank(["z", "b"])], True),  # noise drawn alike tells nothing
        ([_rank(["h"]), _rank(["h", "b"])], False),  # the hidden state alone is no batch
    ],
)
def test_batch_rounds_check(ranks, passed):
    check = _batch_rounds(ORIGINAL, ranks)
    assert check.passed is passed, check.detail


def test_batch_rounds_check_refuses_what_it_cannot_tell_apart():
    """Models that received no tensors to fingerprint prove nothing."""
    check = _batch_rounds(_run([], []), [_rank([]), _rank([])])
    assert not check.passed and check.detail.startswith("not proven")


# -- what each rank reads ---------------------------------------------------------------------
PROBE = textwrap.dedent("""\
    # Run a script; write probe-<RANK>.json: the token ids of every training forward of an
    # EmbeddingBag, and the first row of every pair a training forward of a Linear read.
    import json
    import os
    import runpy
    import sys

    import torch

    seen = []
    bag_forward = torch.nn.EmbeddingBag.forward


    def recording_bag(self, input, *args, **kwargs):
        if torch.is_grad_enabled():
            seen.append(input.tolist())
        return bag_forward(self, input, *args, **kwargs)


    torch.nn.EmbeddingBag.forward = recording_bag
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
    with open(f"probe-{os.environ.get('RANK', 0)}.json", "w") as f:
        json.dump(seen, f)
    """)


@pytest.mark.runs
def test_ranks_train_on_alternate_batches_of_the_originals(tmp_path):
    """fixtures/ddp/project_batcher.py: 12 batches an epoch, 2 epochs. Rank 0 trains on the
    original's batches 0, 2, 4, ... and rank 1 on 1, 3, 5, ..., in both epochs (each
    process shuffles as the original did), 6 steps an epoch on each."""
    name = "ddp/project_batcher.py"
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "probe.py").write_text(PROBE)
    original = run_script(tmp_path / "one" / "probe.py", (FIXTURES_DIR / name,), tmp_path / "one")
    _check(original, name)
    batches = json.loads((tmp_path / "one" / "probe-0.json").read_text())
    assert len(batches) == 24
    script = tmp_path / "project_batcher.py"
    script.write_text(convert_fixture(name).converted, encoding="utf-8")
    ranks = run_ranks(tmp_path / "probe.py", (script,), tmp_path)
    _check(ranks, f"two ranks of {name}")
    rank0, rank1 = (json.loads((tmp_path / f"probe-{r}.json").read_text()) for r in (0, 1))
    assert rank0 == batches[0::2] and rank1 == batches[1::2]


@pytest.mark.runs
@pytest.mark.parametrize("name", ["ddp/project_batcher.py", "ddp/shuffled_batch_list.py"])
def test_one_process_trains_as_before(name, tmp_path):
    """Run with plain `python`, the converted fixture prints what the original prints."""
    script = tmp_path / Path(name).name
    script.write_text(convert_fixture(name).converted, encoding="utf-8")
    converted, original = run_script(script), run_script(FIXTURES_DIR / name)
    _check(converted, name)
    _check(original, name)
    assert converted.stdout == original.stdout != ""


TOTAL_PRINT = (
    'print(f"epoch {epoch} loss {total / len(batches):.3f}")',
    'print(f"epoch {epoch} loss {total:.3f}")',
)


def test_a_printed_total_is_added_up_over_the_processes():
    """Each process sums its share of the batches: the printed total is their sum, taken
    on every process before the rank-0 print; an average (the fixture as it is) stays."""
    source = (FIXTURES_DIR / "ddp" / "project_batcher.py").read_text(encoding="utf-8")
    assert TOTAL_PRINT[0] in source
    code = convert(source.replace(*TOTAL_PRINT)).converted
    assert (
        "        total_all_processes = summed_over_processes(total)\n"
        "        if RANK == 0:\n"
        '            print(f"epoch {epoch} loss {total_all_processes:.3f}")\n'
    ) in code
    assert "dist.all_reduce(total)" in code
    assert "summed_over_processes" not in convert(source).converted


@pytest.mark.runs
def test_the_printed_total_passes_the_proof(cli, tmp_path):
    """Before, the proof refused it: rank 0 printed half the original's total."""
    source = (FIXTURES_DIR / "ddp" / "project_batcher.py").read_text(encoding="utf-8")
    (tmp_path / "train.py").write_text(source.replace(*TOTAL_PRINT))
    run = cli("convert", "train.py", "--to", "ddp", "--amp", "off", "-o", "out.py")
    assert run.exit_code == 0, run.stderr
    assert "--verify ok   printed and logged averages and totals as the original's" in run.stderr


def test_a_count_that_indexes_stays_the_original_s_index():
    """`ys[i]` of `for i, x in enumerate(xs)`: shared below `enumerate()`, `i` would count
    this process's batches, and `x` would meet another batch's targets. The share goes
    around `enumerate()` instead."""
    source = dedent("""\
        import torch
        from data import make_batches
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        xs, ys = make_batches()
        for epoch in range(2):
            for i, x in enumerate(xs):
                loss = (model(x) - ys[i]).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        """)
    code = convert(source).converted
    assert "    for i, x in ShardedBatches(enumerate(xs)):\n" in code
    assert convert(code).converted == code
