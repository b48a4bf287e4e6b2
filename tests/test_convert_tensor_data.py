"""`convert --to ddp` of training data that never passes through a DataLoader sampler:
`batchify()` columns (word_language_model), `torch.randint` offsets (nanoGPT's
`get_batch()`), a project `IterableDataset`, minibatches drawn with Python's `random` (a
replay buffer, random chunks of a text), and what is refused with its reason: full-batch
training, draws seeded alike, steps that each process takes on its own condition (a
project's own batching class is shared by rounds: tests/test_convert_batch_rounds.py). A training loop that nothing calls is left alone.
What the ranks really read is checked in tests/test_convert_tensor_data_runs.py."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DDP = ConvertOptions(target="ddp", amp="off")
FSDP = ConvertOptions(target="fsdp", amp="off")


def convert(source: str, options: ConvertOptions = DDP, path: str = "train.py"):
    return convert_source(source, options, path)


def convert_fixture(name: str, options: ConvertOptions = DDP):
    path = FIXTURES / name
    return convert(path.read_text(encoding="utf-8"), options, str(path))


def wrong(log) -> list:
    return [s for s in log.skipped if s.wrong]


# -- batchify: each process its own columns -------------------------------------------------
def test_batchify_columns_are_split_right_after_batchify():
    conversion = convert_fixture("ddp/batchify_lm.py")
    assert not wrong(conversion.log)
    assert (
        "train_data = batchify(corpus(640, 1), args.batch_size)\n"
        "if DISTRIBUTED:\n"
        "    # each process trains on its own args.batch_size // WORLD_SIZE streams (columns)\n"
        '    assert args.batch_size % WORLD_SIZE == 0, "the streams must divide evenly"\n'
        "    train_data = train_data.chunk(WORLD_SIZE, dim=1)[RANK].contiguous()\n"
        "model = TinyLM(vocab, 24).to(device)\n"
    ) in conversion.converted


def test_batchify_hidden_state_takes_the_per_process_streams():
    converted = convert_fixture("ddp/batchify_lm.py").converted
    assert "hidden = torch.zeros(1, args.batch_size // WORLD_SIZE, 24, device=device)" in converted


def test_word_language_model_converts_and_keeps_its_evaluation_whole():
    """fixtures/lstm_lm.py (pytorch/examples' shape): was refused ("does not read a
    DataLoader"); its training streams are split, `init_hidden` takes the per-process
    count, and the evaluation keeps all of `val_data` and `eval_batch_size`."""
    conversion = convert_fixture("lstm_lm.py")
    assert not wrong(conversion.log)
    code = conversion.converted
    assert "    train_data = train_data.chunk(WORLD_SIZE, dim=1)[RANK].contiguous()\n" in code
    assert "hidden = model.init_hidden(args.batch_size // WORLD_SIZE)" in code
    assert "hidden = model.init_hidden(eval_batch_size)" in code
    assert "val_data.chunk" not in code


def test_fsdp_splits_the_columns_too():
    conversion = convert_fixture("ddp/batchify_lm.py", FSDP)
    assert not wrong(conversion.log)
    assert (
        "train_data = train_data.chunk(WORLD_SIZE, dim=1)[RANK].contiguous()"
        in conversion.converted
    )


COLUMNS = dedent("""\
    import torch

    def batchify(data, bsz):
        return data[: data.size(0) // bsz * bsz].view(-1, bsz)

    bsz = 4
    stream = batchify(torch.arange(400) % 50, bsz)
    model = torch.nn.Embedding(50, 50)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(0, stream.size(0) - 1, 10):
        x, y = stream[i:i + 10], stream[i + 1:i + 11]
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """)


def test_batchify_without_transpose_is_recognised():
    """`view(-1, bsz)`: the streams are the columns as well."""
    conversion = convert(COLUMNS)
    assert not wrong(conversion.log)
    assert (
        "    stream = stream.chunk(WORLD_SIZE, dim=1)[RANK].contiguous()\n" in conversion.converted
    )


def test_batchify_into_rows_is_not_taken_for_columns():
    """`view(bsz, -1)` without a transpose makes rows of streams: not this shape. The loop
    slices rows at the offsets of a range, so it is taken for batches of rows, shared out by
    rounds."""
    source = COLUMNS.replace("view(-1, bsz)", "view(bsz, -1)")
    conversion = convert(source)
    assert not wrong(conversion.log)
    assert "chunk(WORLD_SIZE, dim=1)" not in conversion.converted
    assert "for i in ShardedBatches(range(0, stream.size(0) - 1, 10)):" in conversion.converted


def test_batchify_with_a_literal_batch_is_refused_with_its_line():
    conversion = convert(
        COLUMNS.replace(
            "batchify(torch.arange(400) % 50, bsz)", "batchify(torch.arange(400) % 50, 4)"
        )
    )
    (skip,) = wrong(conversion.log)
    assert skip.line == 7 and "`4` is not a variable" in skip.reason


# -- torch.randint offsets: each process its own draws, the global batch stays ------------
def test_randint_offsets_are_drawn_per_process_with_a_share_of_the_batch():
    conversion = convert_fixture("ddp/randint_lm.py")
    assert not wrong(conversion.log)
    code = conversion.converted
    assert (
        "ix = torch.randint(len(data) - block_size, (per_process_batch_size(batch_size),))" in code
    )
    assert "    torch.manual_seed(torch.initial_seed() + RANK)\n" in code  # seed_each_rank
    (change,) = [c for c in conversion.log.changes if "offsets" in c.description]
    assert change.line == 25 and "global batch // WORLD_SIZE" in change.description


def test_randint_offsets_keep_the_batch_with_per_process_batch():
    options = ConvertOptions(target="ddp", amp="off", per_process_batch=True)
    conversion = convert_fixture("ddp/randint_lm.py", options)
    assert not wrong(conversion.log)
    assert "ix = torch.randint(len(data) - block_size, (batch_size,))" in conversion.converted


def test_randint_offsets_of_processes_seeded_alike_are_refused():
    """A seed that every process sets again inside the loop beats the rank re-seed."""
    source = (
        (FIXTURES / "ddp/randint_lm.py")
        .read_text()
        .replace(
            '    xb, yb = get_batch("train")\n',
            '    torch.manual_seed(it)\n    xb, yb = get_batch("train")\n',
        )
    )
    conversion = convert(source)
    (skip,) = wrong(conversion.log)
    assert skip.line == 46 and "seeds its generator alike" in skip.reason
    assert "per_process_batch_size" not in conversion.converted


# -- a project IterableDataset: split by process and by worker --------------------------------
def test_iterable_dataset_is_read_through_a_sharded_stream():
    conversion = convert_fixture("ddp/iterable_stream.py")
    assert not wrong(conversion.log)
    code = conversion.converted
    assert (
        "loader = DataLoader(\n"
        "    ShardedStream(Readings(96, seed=11)),\n"
        "    batch_size=per_process_batch_size(args.batch_size),\n"
        "    num_workers=args.workers,\n"
        ")\n"
    ) in code
    assert code.count("class ShardedStream(torch.utils.data.IterableDataset):") == 1
    assert "return (items[RANK * workers + worker_id] for items in rounds)" in code


def test_iterable_dataset_that_splits_itself_is_left_alone():
    source = (
        (FIXTURES / "ddp/iterable_stream.py")
        .read_text()
        .replace(
            "        gen = torch.Generator().manual_seed(self.seed)\n",
            "        gen = torch.Generator().manual_seed(self.seed)\n"
            "        info = torch.utils.data.get_worker_info()\n",
        )
    )
    conversion = convert(source)
    assert "ShardedStream" not in conversion.converted
    assert any("reads its process or worker itself" in s.reason for s in conversion.log.skipped)


# -- full-batch training: refused ---------------------------------------------------------
def test_full_batch_training_is_refused_naming_the_loop():
    conversion = convert_fixture("ddp/full_batch_gnn.py")
    (skip,) = wrong(conversion.log)
    assert skip.line == 32
    assert skip.reason.startswith("full-batch training: one graph per step, nothing to shard")


def test_full_batch_refusal_on_the_command_line(cli, tmp_path):
    (tmp_path / "train.py").write_text((FIXTURES / "ddp/full_batch_gnn.py").read_text())
    run = cli("convert", "train.py", "--to", "ddp", "-o", "ddp.py")
    assert run.exit_code == 1
    assert "train.py:32:1: error: DistributedSampler not applied: full-batch training" in run.stderr
    assert not (tmp_path / "ddp.py").exists()


# -- a training loop of a function nothing calls: left alone ---------------------------------
@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_a_training_loop_nothing_calls_is_left_alone(options):
    """`train_plain()` (another entry point's) reads a loader parameter nothing passes: it
    was called full-batch training and refused the script; its model was sharded on the
    second pass (`--to fsdp` stopped on an unstable result)."""
    conversion = convert_fixture("ddp/unused_train_function.py", options)
    assert not wrong(conversion.log)
    (note,) = [s for s in conversion.log.skipped if s.what == "DistributedSampler"]
    assert note.line == 14 and not note.wrong
    assert (
        note.reason
        == "this training loop is in `train_plain()`, which nothing in the program calls: left as it is"
    )
    code = conversion.converted
    plain = (
        (FIXTURES / "ddp/unused_train_function.py")
        .read_text()
        .split("\n\n\ndef train_with_teacher")[0]
    )
    assert plain.split("def train_plain")[1] in code
    assert "sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None\n" in code


# -- minibatches drawn with Python's `random`: each process draws its own ---------------------
@pytest.mark.parametrize("name", ["ddp/replay_buffer.py", "ddp/random_chunks.py"])
def test_batches_drawn_with_pythons_random_need_no_sampler(name):
    """A replay buffer's `random.sample` and random chunk offsets (`random.randrange`, the
    chunk's length a parameter) were called full-batch training, or "does not read a
    DataLoader": unseeded, each process draws its own batches."""
    conversion = convert_fixture(name)
    assert not wrong(conversion.log)
    (note,) = [s for s in conversion.log.skipped if s.what == "DistributedSampler"]
    assert (
        "from Python's or NumPy's generator, unseeded, so each process draws its own" in note.reason
    )
    assert "DDP(" in conversion.converted


def test_pythons_random_seeded_alike_is_reseeded_by_rank_before_training():
    """The replay buffer is sampled with `random`, which the script seeds alike: every
    process would draw the same minibatches. Its stream is offset by the rank where
    torch's is (this was refused, asking for a seed by hand)."""
    source = (
        (FIXTURES / "ddp/replay_buffer.py")
        .read_text()
        .replace("    torch.manual_seed(0)\n", "    torch.manual_seed(0)\n    random.seed(0)\n")
    )
    conversion = convert(source)
    assert not wrong(conversion.log)
    assert (
        "        torch.manual_seed(torch.initial_seed() + RANK)\n"
        "        random.seed(random.getrandbits(64) + RANK)\n"
    ) in conversion.converted


def test_seeded_per_rank_draws_are_not_refused():
    per_rank = (
        "torch.manual_seed(0)\nrank = int(os.environ.get('RANK', 0))\nrandom.seed(1000 + rank)\n"
    )
    source = (
        (FIXTURES / "ddp/random_chunks.py").read_text().replace("torch.manual_seed(0)\n", per_rank)
    )
    source = source.replace("import random\n", "import os\nimport random\n")
    assert not wrong(convert(source).log)


def test_batches_made_by_draws_it_cannot_follow_are_refused_at_the_maker():
    """`random` from a star import (char-rnn's `from helpers import *`): the draws are not
    seen, but the batches come from `random_batch()`, never full-batch training."""
    source = (
        (FIXTURES / "ddp/random_chunks.py")
        .read_text()
        .replace("import random\n", "from textutil import *\n")
    )
    (skip,) = wrong(convert(source).log)
    assert skip.line == 42  # `inputs, targets = random_batch(16, 8)`
    assert skip.reason.startswith(
        "this training loop takes its batches from `random_batch()`, which makes them in a way the"
        " conversion cannot follow"
    )


def test_steps_under_a_condition_on_each_process_s_own_data_are_refused_at_the_condition():
    """DQN learns once the buffer holds enough transitions, in episodes that run until the
    buffer is full: the processes would learn at different episodes, and DDP would hang (in a
    `range()` loop they agree on it: tests/test_convert_episode_guard.py)."""
    source = (
        (FIXTURES / "ddp/replay_buffer.py")
        .read_text()
        .replace("        if episode >= 2:\n", "        if len(memory) >= 36:\n")
        .replace("    for episode in range(8):\n", "    while len(memory) < 96:\n")
    )
    (skip,) = wrong(convert(source).log)
    assert skip.line == 62
    assert skip.reason.startswith(
        "the training steps, which draw their batches at random, run only while `len(memory) >= 36`"
        " holds, which each process computes from its own data"
    )


# -- every conversion is stable ---------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["ddp/batchify_lm.py", "ddp/randint_lm.py", "ddp/iterable_stream.py", "lstm_lm.py"]
)
def test_a_second_conversion_changes_nothing(name):
    first = convert_fixture(name).converted
    assert convert(first, DDP, str(FIXTURES / name)).converted == first


@pytest.mark.parametrize(
    "name", ["ddp/batchify_lm.py", "ddp/randint_lm.py", "ddp/iterable_stream.py"]
)
def test_lines_of_the_original_stay_byte_identical(name):
    """Only the lines the steps rewrite change: every other line of the original (comments,
    quotes, blank lines) is in the result as it was, in order."""
    original = (FIXTURES / name).read_text().splitlines()
    converted = convert_fixture(name).converted.splitlines()
    rewritten = {
        "ddp/batchify_lm.py": {
            "    hidden = torch.zeros(1, args.batch_size, 24, device=device)",
            "        output, hidden = model(tokens, hidden)",
            '    print(f"epoch {epoch} | train loss {total / steps:.4f}")',
            'torch.save(model.state_dict(), "batchify_lm.pt")',
        },
        "ddp/randint_lm.py": {
            "    ix = torch.randint(len(data) - block_size, (batch_size,))",
            "    loss = model(xb, yb)",
            '        print(f"step {it}: train loss {loss.item():.4f}")',
            'print(f"final train loss {loss.item():.4f}")',
        },
        "ddp/iterable_stream.py": {
            "loader = DataLoader(Readings(96, seed=11), batch_size=args.batch_size, num_workers=args.workers)",
            "        loss = nn.functional.cross_entropy(model(x), y)",
            '    print(f"epoch {epoch} | mean loss {total / seen:.4f}")',
        },
    }[name]
    position = 0
    for line in original:
        if line in rewritten:
            continue
        position = converted.index(line, position) + 1


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_a_walk_from_a_random_start_is_refused(options):
    """Ninth unseen set F1 (Char-RNN-PyTorch): `ptr = np.random.randint(...)` then a walk
    over the whole corpus. The draw was taken for batches each process draws its own of,
    and every process trained on all of the corpus (exit 0, silently wrong)."""
    conversion = convert_fixture("ddp/random_start_walk.py", options)
    (skip,) = wrong(conversion.log)
    assert skip.line == 35  # `while ptr + WINDOW + 1 <= len(corpus):`
    assert skip.reason.startswith(
        "this training loop walks its data in order from a position it advances, so every"
        " process would walk all of it"
    )


def test_full_batch_training_read_through_masks_and_an_evaluation_is_said_so():
    """gcn-pytorch (ninth unseen set F6): `output[data.train_mask]` (a mask the graph
    object holds) was taken for slicing by a position, and `evaluate(model, data)` for the
    call that makes the batches: "batches from `evaluate()`", "does not read a
    DataLoader". It is full-batch training."""
    conversion = convert(dedent("""\
        import torch
        import torch.nn.functional as F
        from graphs import load_graph, GCN

        data = load_graph()
        model = GCN(data)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)


        def evaluate(model, data):
            model.eval()
            with torch.no_grad():
                output = model(data)
            return F.nll_loss(output[data.val_mask], data.labels[data.val_mask]).item()


        for epoch in range(200):
            model.train()
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output[data.train_mask], data.labels[data.train_mask])
            loss.backward()
            optimizer.step()
            val = evaluate(model, data)
        """))
    (skip,) = wrong(conversion.log)
    assert skip.reason.startswith("full-batch training: one graph per step, nothing to shard")


def test_an_early_stopper_s_check_is_no_batch_maker():
    """gcn-pytorch (the ninth set's re-run): `stop_checker.check(evals, epoch)` returns a
    value of its own, read from a dict, that nothing trains on; it was named as the call
    that makes the batches. Its step in `train(model, optimizer, data)`: full-batch."""
    conversion = convert(dedent("""\
        import torch
        import torch.nn.functional as F
        from graphs import load_graph, GCN


        class EarlyStopping:
            def __init__(self, patience):
                self.best, self.patience, self.bad = None, patience, 0

            def check(self, evals, epoch):
                loss = evals["val_loss"]
                if self.best is None or loss < self.best:
                    self.best, self.bad = loss, 0
                else:
                    self.bad += 1
                return self.bad > self.patience


        def train(model, optimizer, data):
            model.train()
            optimizer.zero_grad()
            output = model(data)
            F.nll_loss(output[data.train_mask], data.labels[data.train_mask]).backward()
            optimizer.step()


        def evaluate(model, data):
            model.eval()
            with torch.no_grad():
                output = model(data)
            return {"val_loss": F.nll_loss(output[data.val_mask], data.labels[data.val_mask]).item()}


        data = load_graph()
        model = GCN(data)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        stop_checker = EarlyStopping(10)
        for epoch in range(200):
            train(model, optimizer, data)
            evals = evaluate(model, data)
            stop = stop_checker.check(evals, epoch)
            if stop:
                break
        """))
    reasons = [s.reason for s in wrong(conversion.log)]
    assert any(r.startswith("full-batch training: one graph per step") for r in reasons), reasons
    assert not any("takes its batches from" in s.reason for s in conversion.log.skipped)


# -- batches sliced at the offsets of a range ------------------------------------------------
@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_offsets_of_a_range_are_shared_out_by_rounds(options):
    """Eleventh unseen set (transformer-time-series): `get_batch(data, i, bs)` at each offset
    of `range(0, len(data) - 1, bs)` was left to the proof, which passed it on the dropout's
    differing losses while both processes trained on every batch (fsdp, exit 0)."""
    conversion = convert_fixture("ddp/offset_batches.py", options)
    assert not wrong(conversion.log)
    assert (
        "    for batch, i in enumerate(\n"
        "        ShardedBatches(range(0, len(train_data) - 1, batch_size))\n"
        "    ):\n"
    ) in conversion.converted
    assert convert(conversion.converted, options).converted == conversion.converted


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_offsets_whose_steps_hand_on_a_hidden_state_are_refused(options):
    """Every other chunk of one sequence would receive the hidden state of a chunk that does
    not come before it: refused, naming the state and the contiguous split instead."""
    (skip,) = wrong(convert_fixture("ddp/chunked_hidden.py", options).log)
    assert skip.line == 28  # `for i in range(0, len(data) - 1, chunk):`
    assert skip.reason.startswith(
        "this training loop reads its data in order and hands `hidden` from each step to the next"
    )
    assert "`data.chunk(WORLD_SIZE)[RANK]`" in skip.reason


# -- a loop over the phases of an epoch ------------------------------------------------------
def test_a_phase_loop_shards_its_training_loader_only():
    """Eleventh unseen set (brain-segmentation U-Net): both loaders of `loaders[phase]` were
    sharded, and `i * args.batch_size` of the validation branch refused as the training
    step's; set_epoch had no loader to name (`None.sampler`)."""
    conversion = convert_fixture("ddp/phase_loop.py")
    assert not wrong(conversion.log)
    code = conversion.converted
    assert '    "valid": DataLoader(valid, batch_size=args.batch_size),\n' in code
    assert (
        "train_sampler = DistributedSampler(train, shuffle=True) if DISTRIBUTED else None" in code
    )
    assert (
        "for epoch in range(args.epochs):\n    if DISTRIBUTED:\n"
        '        loaders["train"].sampler.set_epoch(epoch)\n'
    ) in code
    assert "                    if i * args.batch_size < args.vis_images:\n" in code
    assert convert(code).converted == code


def test_a_batch_size_read_in_the_training_phase_is_still_the_training_step_s():
    source = (
        (FIXTURES / "ddp/phase_loop.py")
        .read_text()
        .replace(
            'if phase == "valid":\n                    if i * args.batch_size',
            'if phase == "train":\n                    if i * args.batch_size',
        )
    )
    (skip,) = wrong(convert(source).log)
    assert skip.what == "per-process batch"
