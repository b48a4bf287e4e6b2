"""`convert --to ddp`, one test per behaviour of each step, on small scripts.

Each step is run on its own on a script that already has the set-up block (`run_step`);
what a step adds is compared in full, after the set-up block. `convert_source` runs the
whole target where the steps meet.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from autoaccel.convert.launch import companion_files, launch_lines
from autoaccel.convert.log import ConversionLog, ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.transform import new_context
from autoaccel.convert.transforms.distributed import (
    DDP_STEPS,
    ComputeBeforePrinting,
    ConvertSyncBatchNorm,
    DestroyProcessGroup,
    FollowPerProcessBatch,
    GuardRankZero,
    InitProcessGroup,
    LaunchCommands,
    LoadOnEveryRank,
    LogOnRankZero,
    NoSyncAccumulation,
    PrintShardSizes,
    ProgressOnRankZero,
    ReplaceDataParallel,
    ScaleSummedLoss,
    SeedEachRank,
    SetSamplerEpoch,
    ShardEvaluation,
    ShardTrainLoader,
    StopTogether,
    UseLocalGpu,
    WrapModel,
)
from autoaccel.convert.transforms.distributed.init_process_group import (
    CPU_SETUP_BLOCK,
    SETUP_BLOCK,
)
from autoaccel.formatting import format_inserted_code

DDP = ConvertOptions(target="ddp", amp="off")
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
IMPORTS = "import os\n\nimport torch\nimport torch.distributed as dist\n"
SETUP = IMPORTS + SETUP_BLOCK


def apply(step, source: str, options: ConvertOptions, log: ConversionLog) -> str:
    """One step as the pipeline runs it (long inserted lines black-formatted)."""
    after = step(new_context(options, log)).transform_module(cst.parse_module(source)).code
    return format_inserted_code(source, after)


def run_step(step, body: str, options: ConvertOptions = DDP) -> tuple[str, ConversionLog]:
    """Run one step on SETUP + `body` (twice: it must be idempotent); return what follows
    the set-up block, and the log."""
    log = ConversionLog()
    code = apply(step, SETUP + textwrap.dedent(body), options, log)
    assert apply(step, code, options, ConversionLog()) == code, "the step is not idempotent"
    return code.split(SETUP_BLOCK.strip(), 1)[1].lstrip("\n"), log


def imports_of(step, body: str, options: ConvertOptions = DDP) -> str:
    code = apply(step, SETUP + textwrap.dedent(body), options, ConversionLog())
    return code.split("\n# Distributed training")[0]


def dedent(text: str) -> str:
    return textwrap.dedent(text)


TRAIN_LOOP = """\
for epoch in range(3):
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
"""
TOP_LEVEL = dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    model = nn.Linear(4, 2)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    """) + TRAIN_LOOP


# -- the set-up block ---------------------------------------------------------------------
def test_script_without_cuda_gets_a_gloo_only_setup():
    code = convert_source(TOP_LEVEL, DDP).converted
    assert CPU_SETUP_BLOCK.strip() in code


def test_setup_block_goes_after_the_imports():
    log = ConversionLog()
    cuda_script = TOP_LEVEL.replace("nn.Linear(4, 2)", "nn.Linear(4, 2).cuda()")
    tree = InitProcessGroup(new_context(DDP, log)).transform_module(cst.parse_module(cuda_script))
    code = tree.code
    assert code.startswith(
        "import os\n\nimport torch\nimport torch.distributed as dist\nimport torch.nn as nn\n"
        "from torch.utils.data import DataLoader\n\n# Distributed training:"
    )
    assert SETUP_BLOCK.strip() in code
    assert [c.line for c in log.changes] == [3]


@pytest.mark.parametrize(
    "imports, expected",
    [
        (
            "from __future__ import print_function\nimport argparse\n\nimport torch\n",
            "from __future__ import print_function\nimport argparse\nimport os\n\nimport torch\n",
        ),
        # No standard-library import to join: `import os` still goes after them.
        (
            "from __future__ import division\nfrom __future__ import print_function\n\nimport torch\n",
            "from __future__ import division\nfrom __future__ import print_function\n\n"
            "import os\n\nimport torch\n",
        ),
    ],
)
def test_setup_keeps_future_imports_first(imports, expected):
    tree = InitProcessGroup(new_context(DDP, ConversionLog())).transform_module(
        cst.parse_module(imports + TRAIN_LOOP)
    )
    assert tree.code.startswith(expected + "import torch.distributed as dist\n")
    compile(tree.code, "<converted>", "exec")


@pytest.mark.parametrize(
    "source, reason",
    [
        pytest.param(
            "import torch.distributed as dist\ndist.init_process_group('nccl')\n" + TRAIN_LOOP,
            "already sets up torch.distributed",
            id="already-distributed",
        ),
        pytest.param(
            "import torch\nmodel.eval()\nprint(model(x))\n", "no training loop", id="no-training"
        ),
    ],
)
def test_setup_does_nothing_when(source, reason):
    log = ConversionLog()
    result = convert_source(source, DDP)
    assert result.converted == source or "DISTRIBUTED" not in result.converted
    log = result.log
    assert any(reason in s.reason for s in log.skipped)


def test_later_steps_do_nothing_without_the_setup_block():
    tree = cst.parse_module(TOP_LEVEL)
    for step in (s for s in DDP_STEPS if s is not InitProcessGroup):
        assert step(new_context(DDP, ConversionLog())).transform_module(tree).code == TOP_LEVEL


# -- the local GPU ---------------------------------------------------------------------------
def test_fixed_gpu_zero_becomes_the_local_gpu():
    code, log = run_step(UseLocalGpu, "device = torch.device('cuda:0' if use_cuda else 'cpu')\n")
    assert code == "device = torch.device('cuda' if use_cuda else 'cpu')\n"
    assert len(log.changes) == 1


def test_other_fixed_gpus_are_reported():
    code, log = run_step(UseLocalGpu, 'device = torch.device("cuda:1")\n')
    assert code == 'device = torch.device("cuda:1")\n'
    assert "cuda:{LOCAL_RANK}" in log.skipped[0].reason


def test_a_map_location_key_names_where_a_checkpoint_was_saved_and_stays():
    """Rewriting the key made the second conversion differ from the first (caught by the
    idempotency check on pytorch/examples' dcgan, which loads checkpoints)."""
    body = 'state = torch.load(path, map_location={"cuda:0": f"cuda:{LOCAL_RANK}"})\n'
    code, log = run_step(UseLocalGpu, body)
    assert code == body
    assert (log.changes, log.skipped) == ([], [])


def test_a_loaded_checkpoint_converts_in_one_pass():
    source = TOP_LEVEL.replace("nn.Linear(4, 2)", 'nn.Linear(4, 2).to("cuda:0")') + (
        'model.load_state_dict(torch.load("m.pt"))\n'
    )
    converted = convert_source(source, DDP).converted  # raises when a second pass differs
    assert 'torch.load("m.pt", map_location={"cuda:0": f"cuda:{LOCAL_RANK}"})' in converted
    assert '.to("cuda")' in converted


# -- nn.DataParallel -------------------------------------------------------------------------
def test_functional_data_parallel_in_a_forward_is_reported():
    """pytorch/examples' dcgan: `nn.parallel.data_parallel(self.main, input, range(ngpu))`."""
    body = """\
        class G(torch.nn.Module):
            def forward(self, input):
                if self.ngpu > 1:
                    return torch.nn.parallel.data_parallel(self.main, input, range(self.ngpu))
                return self.main(input)
        """
    code, log = run_step(ReplaceDataParallel, body)
    assert code == dedent(body)
    (skip,) = log.skipped
    assert skip.what == "nn.parallel.data_parallel" and "one GPU per process" in skip.reason


def test_data_parallel_and_its_device_count_test_go():
    code, log = run_step(
        ReplaceDataParallel,
        """\
        import torch.nn as nn
        model = Net()
        if torch.cuda.device_count() > 1:
            print("Let's use", torch.cuda.device_count(), "GPUs!")
            model = nn.DataParallel(model)
        model.to(device)
        torch.save(model.module.state_dict(), "m.pt")
        if isinstance(model, nn.DataParallel):
            state = model.module.state_dict()
        """,
    )
    assert code == dedent("""\
        import torch.nn as nn
        model = Net()
        model.to(device)
        torch.save(model.state_dict(), "m.pt")
        if isinstance(model, nn.DataParallel):
            state = model.module.state_dict()
        """)
    assert {c.code for c in log.changes} == {"ACC401"}


def test_data_parallel_under_another_name_becomes_an_alias():
    code, _ = run_step(
        ReplaceDataParallel, "net = torch.nn.DataParallel(model, device_ids=[0, 1])\n"
    )
    assert code == "net = model\n"


def test_data_parallel_moved_to_the_gpu_goes_and_the_move_stays():
    """bearpaw's `model = torch.nn.DataParallel(model).cuda()` was kept and then wrapped in
    DDP: on two GPUs or more, DataParallel refuses parameters off cuda:0 on every rank but
    rank 0 (on a CPU it does nothing, so no proof run could see it)."""
    code, _ = run_step(
        ReplaceDataParallel,
        "model = torch.nn.DataParallel(model).cuda()\ntorch.save(model.module.state_dict(), 'm.pt')\n",
    )
    assert code == "model = model.cuda()\ntorch.save(model.state_dict(), 'm.pt')\n"


# -- DDP wrapper -----------------------------------------------------------------------------
WRAPPED = dedent("""\
    # trained through DDP when distributed: gradients are averaged in backward()
    ddp_model = model
    if DISTRIBUTED:
        ddp_model = DDP(
            model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None
        )
    """)


def test_top_level_model_is_trained_through_its_wrapper():
    code, log = run_step(
        WrapModel,
        """\
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            model.eval()
            print(model(x_val))
        """,
    )
    assert "model = Net().to(device)\n" + WRAPPED in code
    assert "loss = criterion(ddp_model(x), y)" in code
    assert "print(model(x_val))" in code  # evaluation keeps the bare model
    assert len(log.changes) == 2


def test_a_variable_of_the_models_name_in_forward_is_not_where_the_model_is_built():
    # `model = self.fc(x)` in forward() comes first in the file; the model the loop
    # calls is the one `model = Net()` builds, and it is wrapped there.
    source = dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                model = self.fc(x)
                return model


        if __name__ == "__main__":
            loader = DataLoader(dataset, batch_size=8)
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
        """)
    conversion = convert_source(source, DDP, "train.py")
    assert not [item for item in conversion.log.skipped if item.wrong]
    assert "    model = Net()\n    # trained through DDP" in conversion.converted
    assert "cross_entropy(ddp_model(x), y)" in conversion.converted
    assert "        model = self.fc(x)\n        return model\n" in conversion.converted


def test_a_model_no_optimizer_trains_is_wrapped_only_with_trainable_parameters():
    # A distillation teacher beside the student an optimizer trains: DDP raises for a
    # frozen module, so its wrapper is made only when a parameter requires a gradient.
    # (tests/test_convert_verify.py runs this fixture's conversion on two processes.)
    source = (Path(__file__).resolve().parent.parent / "fixtures/ddp/frozen_teacher.py").read_text()
    code = convert_source(source, DDP, "frozen_teacher.py").converted
    assert "    if DISTRIBUTED and any(p.requires_grad for p in teacher.parameters()):\n" in code
    assert "    ddp_student = student\n    if DISTRIBUTED:\n" in code
    assert "soft = F.softmax(ddp_teacher(x) / 2.0, dim=1)" in code


@pytest.mark.parametrize(
    "shown, refused",
    [
        ("print(generate(decoder, 3))", False),
        # Its result is used on every rank: the wrapper would have to reach it.
        ("samples = generate(decoder, 3)\n                print(samples)", True),
    ],
    ids=["only-printed", "result-kept"],
)
def test_a_function_whose_result_is_only_printed_keeps_the_bare_model(shown, refused):
    """fixtures/ddp/printed_samples.py (hunkim's char-RNN): `generate()` calls
    `decoder.init_hidden()`, which a DDP wrapper lacks, so it cannot receive one."""
    source = (
        Path(__file__).resolve().parent.parent / "fixtures/ddp/printed_samples.py"
    ).read_text()
    source = source.replace("print(generate(decoder, 3, 8))", shown.replace("3)", "3, 8)"))
    conversion = convert_source(source, DDP, "printed_samples.py")
    wrong = [item.what for item in conversion.log.skipped if item.wrong]
    assert wrong == (["DistributedDataParallel"] if refused else [])
    if not refused:
        code = conversion.converted
        assert "output, hidden = ddp_decoder(sequence[:, c], hidden)" in code
        assert "def generate(decoder, start, length):\n    hidden = decoder.init_hidden(1)" in code
        assert "print(generate(decoder, 3, 8))" in code


SAMPLES = """\
def generate(model, idx, steps):
    block_size = model.get_block_size()
    for _ in range(steps):
        logits = model(idx[:, -block_size:])
        logits[logits < 0] = 0
        idx = torch.cat([idx, logits.argmax(-1)[:, -1:]], dim=1)
    return idx


def print_samples(num):
    samples, shown = generate(model, start, 8), []
    {store}
    print(samples)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    if step % 200 == 0:
        print_samples(num=10)
"""


@pytest.mark.parametrize(
    "store, refused",
    [
        ("shown.append(samples)", False),
        ("history[step] = samples", True),  # kept beyond the function: it may train
        ("self.samples = samples", True),
    ],
    ids=["local", "global-item", "attribute"],
)
def test_a_sampling_function_keeps_the_bare_model_unless_it_keeps_its_result(store, refused):
    """makemore's print_samples() (a statement of its own) calls generate(model, ...),
    which calls `model.get_block_size()`: no backward pass can follow, so the bare
    model serves, with its own methods. A result stored beyond the function may train."""
    code, log = run_step(WrapModel, SAMPLES.replace("{store}", store))
    wrong = [item.what for item in log.skipped if item.wrong]
    assert wrong == (["DistributedDataParallel"] if refused else [])
    if not refused:
        assert "    block_size = model.get_block_size()\n" in code
        assert "        logits = model(idx[:, -block_size:])\n" in code
        assert "    loss = criterion(ddp_model(x), y)\n" in code


def test_a_printed_function_reading_the_global_model_keeps_it_bare():
    """hunkim's seq2seq prints `translate()`, which runs the global encoder and decoder:
    through the wrappers it ran a DDP forward on rank 0 alone, never computed before the
    print (it is given no model)."""
    code, log = run_step(
        WrapModel,
        """\
        def translate(x):
            return model(x).argmax()


        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(translate(x))
        """,
    )
    assert "    return model(x).argmax()\n" in code
    assert "loss = criterion(ddp_model(x), y)" in code
    assert not [item for item in log.skipped if item.wrong]


def test_model_passed_to_a_training_function_is_passed_wrapped():
    code, _ = run_step(
        WrapModel,
        """\
        def train(model, loader, optimizer):
            model.train()
            for x, y in loader:
                F.nll_loss(model(x), y).backward()
                optimizer.step()


        def main():
            model = Net().to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(3):
                train(model, loader, optimizer)
                test(model, loader)
        """,
    )
    assert "F.nll_loss(model(x), y).backward()" in code
    assert "train(ddp_model, loader, optimizer)" in code
    assert "test(model, loader)" in code


HELPER_LOSS = """\
def compute_loss(net, x, y):
    return F.nll_loss(net(x), y)


def evaluate(net, x, y):
    net.eval()
    score = F.nll_loss(net(x), y).item()
    net.train()
    return score


def train(model, loader, optimizer):
    for x, y in loader:
        loss = compute_loss(model, x, y)
        loss.backward()
        optimizer.step()
    return evaluate(model, x, y)


def main():
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        train(model, loader, optimizer)
"""


def test_a_helper_whose_forward_is_trained_on_gets_the_wrapper_an_evaluation_the_model():
    """A function that trains nothing gets the model itself (cs230's `evaluate()`, which
    puts it in evaluation mode), unless its forward pass may be trained on: a helper that
    computes the loss the caller back-propagates must run the DDP wrapper."""
    code, log = run_step(WrapModel, HELPER_LOSS)
    assert not [item for item in log.skipped if item.wrong]
    assert "        loss = compute_loss(model, x, y)\n" in code
    assert "    return evaluate(unwrapped(model), x, y)\n" in code
    assert "train(ddp_model, loader, optimizer)" in code


RECEIVES = """\
def save(net, path):
    torch.save(net.state_dict(), path)


def evaluate(net, x):
    return net(x).sum().item()


def train(model, loader, optimizer):
    for x, y in loader:
        F.nll_loss(model(x), y).backward()
        optimizer.step()
    {use}


def main():
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        train(model, loader, optimizer)
"""


@pytest.mark.parametrize(
    "use, refused",
    [
        ("score = evaluate(model, x)", False),  # a forward: the same through the wrapper
        # the checkpoint's keys, the names: read from the model itself, without `module.`
        ("save(model, 'model.pt')", False),
        ("names = [n for n, _ in model.named_parameters() if n == 'fc.weight']", False),
        ("hidden = model.init_hidden(8)", True),  # another call: it may compute with layers
        ("return model", True),  # the caller would hold the wrapper
    ],
    ids=["forward-helper", "saving-helper", "parameter-names", "own-method", "returned"],
)
def test_a_training_function_receives_the_wrapper_only_if_it_works_alike(use, refused):
    """Shawn1993's train() passed the model it received to save() (`state_dict()`) and
    compared `named_parameters()` names: given the wrapper, the checkpoint keys and
    the names gained a `module.` prefix (a max-norm constraint then matched nothing).
    Such reads now go to the model itself, `unwrapped(model)`, and so do the arguments of
    functions that train nothing and run no forward pass that may be trained on (cs230's
    `load_checkpoint()`; an `evaluate()` that puts the model in evaluation mode)."""
    code, log = run_step(WrapModel, RECEIVES.replace("{use}", use))
    wrong = [item.what for item in log.skipped if item.wrong]
    assert wrong == (["DistributedDataParallel"] if refused else [])
    assert ("train(ddp_model, loader, optimizer)" in code) is not refused
    if use.startswith("save"):  # a function that neither trains nor runs it: the model itself
        assert "save(unwrapped(model), " in code
    if use.startswith("score"):  # a forward pass that may be trained on: the wrapper
        assert "score = evaluate(model, x)" in code
    if "named_parameters" in use:
        assert "for n, _ in unwrapped(model).named_parameters()" in code


def test_model_of_a_trainer_class_is_wrapped_in_init():
    code, _ = run_step(
        WrapModel,
        """\
        class Trainer:
            def __init__(self, model):
                self.model = model.to(device)
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def train_epoch(self):
                for x, y in self.loader:
                    self.criterion(self.model(x), y).backward()
                    self.optimizer.step()
        """,
    )
    assert "        self.ddp_model = self.model\n        if DISTRIBUTED:\n" in code
    assert "self.criterion(self.ddp_model(x), y).backward()" in code


def test_wrapper_import_joins_the_torch_imports():
    assert imports_of(WrapModel, TOP_LEVEL.split("import torch.nn as nn\n", 1)[1]).endswith(
        "import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    )


def test_training_function_that_uses_other_model_attributes_is_left_alone():
    _, log = run_step(
        WrapModel,
        """\
        def train(model):
            hidden = model.init_hidden(8)
            for x, y in loader:
                model(x, hidden).sum().backward()
                optimizer.step()


        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            train(model)
        """,
    )
    assert "`model` is not wrapped; build `ddp_model = DDP(model, ...)`" in log.skipped[0].reason


# -- sampler, batch, set_epoch ---------------------------------------------------------------
def test_train_loader_gets_a_distributed_sampler_and_a_per_process_batch():
    code, log = run_step(
        ShardTrainLoader,
        "from torch.utils.data import DataLoader\n" + TOP_LEVEL.split("DataLoader\n", 1)[1],
    )
    assert (
        "sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None\n"
        "loader = DataLoader(\n"
        "    dataset,\n"
        "    batch_size=per_process_batch_size(32),\n"
        "    shuffle=sampler is None,\n"
        "    sampler=sampler,\n"
        ")\n"
    ) in code
    assert "def per_process_batch_size(global_batch_size):" in code
    assert "shuffle moves into the sampler" in log.changes[0].description


def test_per_process_batch_option_keeps_the_batch_size():
    options = ConvertOptions(target="ddp", amp="off", per_process_batch=True)
    code, _ = run_step(ShardTrainLoader, TOP_LEVEL, options)
    assert "batch_size=32," in code or "batch_size=32)" in code
    assert "per_process_batch_size" not in code


def test_unshuffled_loader_gets_an_unshuffled_sampler():
    code, _ = run_step(ShardTrainLoader, TOP_LEVEL.replace("shuffle=True", "shuffle=False"))
    assert "DistributedSampler(dataset, shuffle=False)" in code
    assert "shuffle=False" in code.split("loader = DataLoader(")[1]


def test_dataset_built_in_the_call_is_named_first():
    code, _ = run_step(
        ShardTrainLoader,
        TOP_LEVEL.replace("DataLoader(dataset,", "DataLoader(Digits(256),"),
    )
    assert "dataset = Digits(256)\nsampler = DistributedSampler(dataset, shuffle=True)" in code


def test_loader_keywords_from_a_dict_get_the_sampler_in_the_dict():
    code, _ = run_step(
        ShardTrainLoader,
        """\
        from torch.utils.data import DataLoader
        train_kwargs = {"batch_size": args.batch_size}
        train_kwargs.update({"shuffle": True})
        train_loader = DataLoader(dataset1, **train_kwargs)
        test_loader = DataLoader(dataset2, batch_size=64)
        for epoch in range(3):
            for x, y in train_loader:
                model(x).sum().backward()
                optimizer.step()
        """,
    )
    assert dedent("""\
        if DISTRIBUTED:
            train_kwargs["sampler"] = DistributedSampler(
                dataset1, shuffle=train_kwargs.pop("shuffle", False)
            )
            train_kwargs["batch_size"] = per_process_batch_size(train_kwargs["batch_size"])
        train_loader = DataLoader(dataset1, **train_kwargs)
        test_loader = DataLoader(dataset2, batch_size=64)
        """) in code


def test_loader_with_its_own_sampler_is_reported():
    code, log = run_step(ShardTrainLoader, TOP_LEVEL.replace("shuffle=True", "sampler=weighted"))
    assert "DistributedSampler" not in code
    assert "already has a sampler" in log.skipped[0].reason


def test_set_epoch_starts_the_epoch_loop_around_the_step_loop():
    source = TOP_LEVEL.replace("shuffle=True", "sampler=sampler") + ""
    source = "sampler = DistributedSampler(dataset) if DISTRIBUTED else None\n" + source
    source = "from torch.utils.data import DistributedSampler\n" + source
    code, log = run_step(SetSamplerEpoch, source)
    assert dedent("""\
        for epoch in range(3):
            if DISTRIBUTED:
                loader.sampler.set_epoch(epoch)
            for x, y in loader:
        """) in code
    assert log.changes[0].code == "ACC105"


TRAIN_FUNCTION = dedent("""\
    from torch.utils.data import DataLoader, DistributedSampler
    def train(epoch, model, train_loader):
        pass
        for x, y in train_loader:
            model(x).sum().backward()
            optimizer.step()


    train_sampler = DistributedSampler(ds) if DISTRIBUTED else None
    loader = DataLoader(ds, sampler=train_sampler)
    for epoch in range(1, 4):
        train(epoch, model, loader)
    """)


def test_set_epoch_goes_where_the_training_function_is_called():
    code, _ = run_step(SetSamplerEpoch, TRAIN_FUNCTION)
    assert (
        "for epoch in range(1, 4):\n    if DISTRIBUTED:\n        loader.sampler.set_epoch(epoch)\n"
        "    train(epoch, model, loader)"
    ) in code


def test_set_epoch_is_not_added_where_the_training_function_sets_it():
    """Horovod's examples call `train_sampler.set_epoch(epoch)` at the top of `train()`."""
    body = TRAIN_FUNCTION.replace("pass", "train_sampler.set_epoch(epoch)")
    code, log = run_step(SetSamplerEpoch, body)
    assert code == body and not log.changes


def test_set_epoch_by_hand_names_a_loader_where_the_loop_reads_an_expression():
    """`loaders[phase]` of a train/valid phase loop has no name: the note said
    `None.sampler.set_epoch(epoch)`."""
    source = dedent("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        loaders = {"train": DataLoader(data, batch_size=8, shuffle=True)}
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for phase in ["train"]:
                for x, y in loaders[phase]:
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        """)
    (skip,) = [s for s in convert_source(source, DDP).log.skipped if s.what == "set_epoch"]
    assert "`train_loader.sampler.set_epoch(epoch)` (its training DataLoader's)" in skip.reason


# -- gradient accumulation -------------------------------------------------------------------
ACCUMULATION = dedent("""\
    optimizer = torch.optim.AdamW(model.parameters())
    ddp_model = DDP(model) if DISTRIBUTED else model
    for epoch in range(3):
        for step, (x, y) in enumerate(loader):
            logits = ddp_model(x)
            loss = criterion(logits, y) / accum_steps
            loss.backward()
            total += loss.item()
            if (step + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """)


def test_accumulation_micro_steps_skip_the_all_reduce():
    code, log = run_step(
        NoSyncAccumulation,
        "from torch.nn.parallel import DistributedDataParallel as DDP\n" + ACCUMULATION,
    )
    assert (
        textwrap.indent(
            dedent("""\
            for step, (x, y) in enumerate(loader):
                # all-reduce the gradients only on the micro-step that updates the weights
                sync_gradients = (step + 1) % accum_steps == 0
                no_sync = DISTRIBUTED and not sync_gradients
                with ddp_model.no_sync() if no_sync else contextlib.nullcontext():
                    logits = ddp_model(x)
                    loss = criterion(logits, y) / accum_steps
                    loss.backward()
                total += loss.item()
                if sync_gradients:
                    optimizer.step()
        """),
            "    ",
        )
        in code
    )
    assert log.changes[0].code == "ACC404"


def test_no_accumulation_no_no_sync():
    source = "from torch.nn.parallel import DistributedDataParallel as DDP\n" + ACCUMULATION.replace(
        "        if (step + 1) % accum_steps == 0:\n            optimizer.step()\n            optimizer.zero_grad()\n",
        "        optimizer.step()\n",
    )
    code, log = run_step(NoSyncAccumulation, source)
    assert "no_sync" not in code and not log.changes


def test_an_update_in_either_branch_is_no_accumulation():
    """word_language_model: `optimizer.step()` or a manual SGD update, every step."""
    source = "from torch.nn.parallel import DistributedDataParallel as DDP\n" + ACCUMULATION.replace(
        "            optimizer.zero_grad()\n",
        "            optimizer.zero_grad()\n        else:\n            for p in model.parameters():\n"
        "                p.data.add_(p.grad, alpha=-0.1)\n",
    ).replace(
        "(step + 1) % accum_steps == 0", "use_optimizer"
    )
    code, log = run_step(NoSyncAccumulation, source)
    assert "else:" in code and "no_sync" not in code and not log.changes


# -- rank 0 only -----------------------------------------------------------------------------
def test_adjacent_prints_and_saves_share_one_rank_zero_guard():
    code, log = run_step(
        GuardRankZero,
        """\
        print('-' * 89)
        print('| end of epoch')  # summary
        x = 1
        torch.save(model.state_dict(), 'm.pt')
        """,
    )
    assert code == dedent("""\
        if RANK == 0:
            print('-' * 89)
            print('| end of epoch')  # summary
        x = 1
        if RANK == 0:
            torch.save(model.state_dict(), 'm.pt')
        """)
    assert [c.code for c in log.changes] == ["ddp", "ACC403"]


def test_a_write_alone_in_a_one_line_if_joins_its_test():
    """WideResNet-pytorch: `if args.tensorboard: configure("runs/%s" % name)` (the eighth
    unseen set): the write is part of no statement of its own, and was refused."""
    code, log = run_step(
        GuardRankZero,
        """\
        from tensorboard_logger import configure
        if args.tensorboard: configure("runs/x")
        if a or b: print(a)
        if a: print(a)
        else: print(b)
        """,
    )
    assert 'if args.tensorboard and RANK == 0: configure("runs/x")\n' in code
    assert "if (a or b) and RANK == 0: print(a)\n" in code
    assert "if a: print(a)\nelse: print(b)\n" in code  # (an `else`: left as it is)
    assert [s.what for s in log.skipped if s.wrong] == []


def test_a_print_that_runs_the_ddp_model_computes_it_on_every_rank_first():
    """A DDP forward broadcasts the model's buffers (BatchNorm): run on rank 0 alone under
    the print's guard, it aborted both processes (gloo: "Received data size doesn't match
    expected size")."""
    code, log = run_step(
        ComputeBeforePrinting,
        """\
        from torch.nn.parallel import DistributedDataParallel as DDP


        def evaluate(m, x, y):
            return m(x)


        ddp_model = DDP(model)
        for x, y in loader:
            print(evaluate(ddp_model, x, y), ddp_model(x).sum().item())
        """,
    )
    assert dedent("""\
        for x, y in loader:
            evaluate_result = evaluate(ddp_model, x, y)
            ddp_model_result = ddp_model(x)
            print(evaluate_result, ddp_model_result.sum().item())
        """) in code
    assert [c.description for c in log.changes] == [
        "`evaluate_result` computed on every process before the rank-0 print",
        "`ddp_model_result` computed on every process before the rank-0 print",
    ]


def test_file_opened_for_writing_is_written_on_rank_zero():
    code, _ = run_step(
        GuardRankZero,
        """\
        if val_loss < best:
            with open(args.save, 'wb') as f:
                torch.save(model.state_dict(), f)
            best = val_loss
        """,
    )
    assert code == dedent("""\
        if val_loss < best:
            if RANK == 0:
                with open(args.save, 'wb') as f:
                    torch.save(model.state_dict(), f)
            best = val_loss
        """)


def test_a_file_opened_in_the_arguments_of_a_call_statement_is_written_on_rank_zero():
    """`pickle.dump(vocab, open("vocab.pkl", "wb"))` (a char-RNN's vocabulary): the
    statement's value is dropped, so the statement goes under the guard (it was refused
    as "part of an expression")."""
    code, log = run_step(
        GuardRankZero,
        """\
        pickle.dump(vocab, open("vocab.pkl", "wb"))
        json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
        """,
    )
    assert code == dedent("""\
        if RANK == 0:
            pickle.dump(vocab, open("vocab.pkl", "wb"))
            json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
        """)
    assert not [s for s in log.skipped if s.wrong]


def test_function_that_only_writes_returns_early_on_other_ranks():
    code, _ = run_step(
        GuardRankZero,
        """\
        def save_checkpoint(epoch):
            \"\"\"Save.\"\"\"
            os.makedirs("ckpt", exist_ok=True)
            torch.save({"epoch": epoch}, "ckpt/last.pt")
        """,
    )
    assert (
        '    """Save."""\n    if RANK != 0:\n        return  # only rank 0 writes\n    os.makedirs'
        in code
    )


def test_a_weights_and_biases_run_is_logged_from_rank_zero_only():
    """`wandb.init()` on every process made one run per process, and `wandb.log()` or
    `wandb.run.name = ...` on a process that did not init fails: all go on rank 0."""
    code, log = run_step(
        GuardRankZero,
        """\
        import wandb
        wandb.init(project="demo")
        wandb.run.name = "baseline"
        for x, y in loader:
            loss = criterion(model(x), y)
            wandb.log({"loss": loss.item()})
        wandb.finish()
        """,
    )
    assert (
        'if RANK == 0:\n    wandb.init(project="demo")\n    wandb.run.name = "baseline"\n' in code
    )
    assert '    if RANK == 0:\n        wandb.log({"loss": loss.item()})\n' in code
    assert "if RANK == 0:\n    wandb.finish()\n" in code
    assert [c.description for c in log.changes] == ["experiment log on rank 0 only"] * 3


LOGGER = """\
import tensorflow as tf


class Logger:
    def __init__(self, log_dir):
        self.writer = tf.summary.FileWriter(log_dir)

    def scalar_summary(self, tag, value, step):
        self.writer.add_summary(tf.Summary(value=[tag, value]), step)
{extra}

logger = Logger("./logs")
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    logger.scalar_summary("loss", loss.item(), step)
"""


@pytest.mark.parametrize(
    "extra, replaced",
    [
        ("", True),
        ("\n    def last_step(self):\n        return self.step\n", False),  # it answers something
    ],
    ids=["only-logs", "returns-a-value"],
)
def test_a_logger_class_of_the_project_is_made_on_rank_zero_only(extra, replaced):
    """L1aoXingyu's and yunjey's `Logger` (a `tf.summary.FileWriter` in `__init__`, in
    a logger.py beside the script) wrote one event file per process."""
    body = LOGGER.replace("{extra}", extra)
    code, log = run_step(LogOnRankZero, body)
    assert ('logger = Logger("./logs") if RANK == 0 else NoWriter()\n' in code) is replaced
    assert len(log.changes) == int(replaced)


@pytest.mark.parametrize(
    "start, made",
    [
        (
            'run = wandb.init(project="demo")',
            'run = wandb.init(project="demo") if RANK == 0 else NoWriter()',
        ),
        (
            'with wandb.init(project="demo") as run:\n    train()',
            'with (wandb.init(project="demo") if RANK == 0 else NoWriter()) as run:\n    train()',
        ),
    ],
    ids=["kept-run", "context"],
)
def test_a_weights_and_biases_run_the_script_keeps_is_made_on_rank_zero(start, made):
    """A run kept in a variable, or a `with` block (which may hold the training): the
    other ranks get a `NoWriter()`, and what they log through it does nothing."""
    body = f"import wandb\n{start}\nrun.log({{'loss': 1.0}})\n"
    code, log = run_step(LogOnRankZero, body)
    assert made in code and "run.log({'loss': 1.0})\n" in code
    code, log = run_step(GuardRankZero, code.split("\n\n\n", 1)[1])  # the step that follows
    assert (log.changes, log.skipped) == ([], [])


@pytest.mark.parametrize(
    "bar, drawn",
    [
        ("for x, y in tqdm(loader):", "for x, y in tqdm(loader, disable=RANK != 0):"),
        (
            "for i in trange(10, desc='epochs'):",
            "for i in trange(10, desc='epochs', disable=RANK != 0):",
        ),
        (
            "for x, y in tqdm(loader, disable=args.quiet):",
            "for x, y in tqdm(loader, disable=args.quiet):",
        ),
        (
            "for x, y in tqdm(loader) if RANK == 0 else loader:",
            "for x, y in tqdm(loader) if RANK == 0 else loader:",
        ),
        # disentangling-VAE's `**kwargs` held `disable` already: a second was a TypeError
        ("for i in trange(10, **kwargs):", "for i in trange(10, **kwargs):"),
    ],
    ids=["tqdm", "trange", "own-disable", "rank-guarded", "keywords-from-kwargs"],
)
def test_progress_bars_are_drawn_on_rank_zero_only(bar, drawn):
    """Every process drew its bars over the same terminal (unseen public scripts); a bar
    that says when it is disabled, or that a rank test guards, is the script's choice."""
    body = f"from tqdm.auto import tqdm, trange\n{bar}\n    pass\n"
    code, log = run_step(ProgressOnRankZero, body)
    assert f"{drawn}\n    pass\n" in code
    assert len(log.changes) == int(bar != drawn)
    assert run_step(ProgressOnRankZero, code)[0] == code  # a second pass changes nothing


def test_already_guarded_writes_are_left_alone():
    body = "if dist.get_rank() == 0:\n    print('x')\n"
    assert run_step(GuardRankZero, body)[0] == body


# -- loading, the end, SyncBatchNorm -------------------------------------------------------
def test_load_after_a_save_waits_for_rank_zero_and_maps_to_the_local_gpu():
    code, _ = run_step(
        LoadOnEveryRank,
        """\
        if RANK == 0:
            torch.save(model.state_dict(), "m.pt")
        model.load_state_dict(torch.load("m.pt"))
        """,
    )
    assert code.endswith(
        "if DISTRIBUTED:\n    dist.barrier()  # rank 0 may still be writing it\n"
        'model.load_state_dict(torch.load("m.pt", map_location={"cuda:0": f"cuda:{LOCAL_RANK}"}))\n'
    )


def test_a_file_opened_for_loading_is_opened_after_the_barrier():
    """`with open(path) as f:` around the load: waiting inside it would read a file
    rank 0 may still be writing (pytorch/examples' word_language_model loads this way)."""
    code, _ = run_step(
        LoadOnEveryRank,
        """\
        if RANK == 0:
            torch.save(model, "m.pt")
        with open("m.pt", "rb") as f:
            model = torch.load(f)
        """,
    )
    assert code.endswith(
        "if DISTRIBUTED:\n    dist.barrier()  # rank 0 may still be writing it\n"
        'with open("m.pt", "rb") as f:\n'
        '    model = torch.load(f, map_location={"cuda:0": f"cuda:{LOCAL_RANK}"})\n'
    )


def test_process_group_is_destroyed_at_the_end_of_main():
    code, _ = run_step(
        DestroyProcessGroup, "def main():\n    pass\n\n\nif __name__ == '__main__':\n    main()\n"
    )
    assert code.endswith(
        "    main()\n\n    if DISTRIBUTED:\n"
        "        # free the models first: left to the exit, they can abort the process\n"
        "        gc.collect()\n        dist.destroy_process_group()\n"
    )


def test_module_level_ddp_model_is_freed_before_the_process_group():
    """Left to the exit, a module-level DDP model aborted 3 of 16 runs on two CPU
    processes ("terminate called without an active exception"); freed first, 0 of 40."""
    body = """\
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = nn.Linear(4, 2)
        ddp_model = model
        if DISTRIBUTED:
            ddp_model = DDP(model)
        print(ddp_model)
        """
    code, _ = run_step(DestroyProcessGroup, body)
    assert code.endswith("    del ddp_model\n    gc.collect()\n    dist.destroy_process_group()\n")
    assert "import gc\n" in imports_of(DestroyProcessGroup, body)


def test_an_instance_holding_the_ddp_model_is_freed_before_the_process_group():
    """`self.ddp_model = DDP(...)` in a method of the project's class: the module-level
    `trainer` keeps it alive to the exit, where it may abort the process or hang it (a CI
    run of fixtures/facts/base_class/main.py, whose `exp` holds it, did); an instance of
    a class that holds none (`logger`) and the class itself (`Run`) stay."""
    body = """\
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Trainer:
            def __init__(self, model):
                self.model = model

            def fit(self):
                self.ddp_model = DDP(self.model)

        class Logger:
            pass

        logger = Logger()
        Run = Trainer  # the class, not an instance: nothing of it to free
        trainer = Run(nn.Linear(4, 2))
        trainer.fit()
        """
    code, _ = run_step(DestroyProcessGroup, body)
    assert code.endswith("    del trainer\n    gc.collect()\n    dist.destroy_process_group()\n")


def test_ddp_model_bound_in_a_block_or_a_function_is_not_deleted():
    """`del` of a name bound only under an `if`, or local to a function, would fail or
    do nothing."""
    body = """\
        from torch.nn.parallel import DistributedDataParallel as DDP


        def main():
            ddp_model = DDP(nn.Linear(4, 2))

        if args.distributed:
            wrapped = DDP(nn.Linear(4, 2))
        main()
        """
    code, _ = run_step(DestroyProcessGroup, body)
    assert not [line for line in code.splitlines() if line.lstrip().startswith("del ")]
    assert code.endswith("    gc.collect()\n    dist.destroy_process_group()\n")


def test_ddp_wrappers_are_the_names_a_ddp_model_is_assigned_or_passed_to():
    # Found from the DDP calls of the module's node list and the assignment around each.
    source = SETUP + dedent("""\
        from torch.nn.parallel import DistributedDataParallel as DDP


        def train(net, steps):
            pass


        model = DDP(nn.Linear(4, 2)).to(device)
        a = b = DDP(m)
        make = lambda: DDP(m)
        annotated: DDP = DDP(m)
        train(model, 3)
        print(DDP(m))
        """)
    tree = cst.parse_module(source)
    step = DestroyProcessGroup(new_context(DDP, ConversionLog()))
    step.transform_module(tree)
    assert step.ddp_wrappers(tree) == {"model", "a", "b", "make", "net"}


def test_sync_batchnorm_only_when_asked():
    assert run_step(ConvertSyncBatchNorm, TOP_LEVEL)[0].count(
        "SyncBatchNorm"
    ) == 0 or not ConvertSyncBatchNorm.enabled(DDP)
    options = ConvertOptions(target="ddp", amp="off", sync_bn=True)
    code, _ = run_step(ConvertSyncBatchNorm, TOP_LEVEL, options)
    assert (
        "model = nn.Linear(4, 2)\nif DISTRIBUTED:\n"
        "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
    ) in code


# -- launchers -------------------------------------------------------------------------------
def test_torchrun_is_the_default_launcher():
    result = convert_source(TOP_LEVEL, DDP)
    assert "torchrun --standalone --nproc_per_node=gpu train.py" in result.log.launch
    assert "python train.py" in result.log.launch
    assert result.log.extra_files == {}


def test_slurm_launcher_writes_an_sbatch_script():
    ((name, text),) = companion_files("exp/train.py", "slurm").items()
    assert name == "train.sbatch"
    assert "srun torchrun" in text and '--rdzv_endpoint="$head_node:29500"' in text
    assert text.rstrip().endswith('train.py "$@"')
    assert launch_lines("train.py", "slurm")[1] == "sbatch train.sbatch"


def test_spawn_launcher_writes_a_launcher_that_compiles():
    ((name, text),) = companion_files("train.py", "spawn").items()
    assert name == "spawn_train.py"
    compile(text, name, "exec")
    assert "mp.spawn(run" in text


def test_launch_step_fills_the_report():
    log = ConversionLog()
    options = ConvertOptions(target="ddp", amp="off", launcher="spawn")
    LaunchCommands(new_context(options, log)).transform_module(cst.parse_module(SETUP))
    assert "python spawn_train.py --nproc 2" in log.launch
    assert set(log.extra_files) == {"spawn_train.py"}


# -- the whole target ------------------------------------------------------------------------
def test_whole_target_on_a_top_level_script():
    result = convert_source(TOP_LEVEL, DDP)
    code = result.converted
    assert "ddp_model = DDP(" in code
    assert "loader.sampler.set_epoch(epoch)" in code
    assert code.rstrip().endswith("dist.destroy_process_group()")
    compile(code, "train.py", "exec")


def test_report_lines_are_lines_of_the_original():
    """Steps log lines of the text they get; the report maps each back once. (An item
    logged early used to be mapped again by every later step that logged a change.)"""
    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn

        model = nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(64, 4)
        for epoch in range(2):
            for i in range(0, 64, 16):
                x = data[i : i + 16].cuda()
                loss = model(x).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                print(loss.item())
        torch.save(model.state_dict(), "model.pt")
        """)
    log = convert_source(source, DDP).log
    lines = source.splitlines()
    (rounds,) = [c for c in log.changes if "ShardedBatches" in c.description]
    assert lines[rounds.line - 1] == "    for i in range(0, 64, 16):"
    saves = [c for c in log.changes if "save" in c.description]
    assert saves and all(lines[c.line - 1].startswith("torch.save(") for c in saves)


def test_a_loop_whose_model_is_not_recognised_is_reported():
    """A model from the user's own package, updated by hand (no optimizer): nothing
    says it is a model, so it stays unwrapped, and the report must say so."""
    source = textwrap.dedent("""\
        import torch
        import mymodels

        model = mymodels.RNN(10).cuda()
        data = torch.randn(64, 4)
        for epoch in range(2):
            for i in range(0, 64, 16):
                loss = model(data[i : i + 16].cuda()).pow(2).mean()
                model.zero_grad()
                loss.backward()
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.1)
        """)
    result = convert_source(source, DDP)
    assert "DDP(" not in result.converted
    (skip,) = [s for s in result.log.skipped if s.what == "DistributedDataParallel"]
    assert skip.line == 7 and "nothing is wrapped" in skip.reason


# -- stopping together ---------------------------------------------------------------------
STOP_BODY = """\
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    output = (model(x) - y).pow(2).mean()
    loss = output.item()
    optimizer.zero_grad()
    output.backward()
    optimizer.step()
    if {test}:
        break
"""


@pytest.mark.parametrize("test", ["loss < 1e-3", "output.item() < 1e-3 and step > 10"])
def test_a_loop_that_stops_on_its_own_loss_stops_on_every_process_at_once(test):
    """pytorch/examples' regression stops when its loss is small: under torchrun each
    process stopped at another step and the others never finished. The condition is
    all-reduced: when it holds on any process, all stop."""
    code, log = run_step(StopTogether, STOP_BODY.format(test=test))
    helper = code.split("\n\n\n")[0]
    assert "def on_any_rank(condition):" in helper and "dist.ReduceOp.MAX" in helper
    assert code.endswith(STOP_BODY.format(test=f"on_any_rank({test})"))
    (change,) = log.changes
    assert (
        change.line == SETUP.count("\n") + 9
        and "every process stops at the same step" in change.description
    )
    assert log.skipped == []


def test_a_counter_set_under_a_test_of_the_loss_is_the_processes_own():
    """DGI: `if loss < best: best, cnt_wait = loss, 0` / `else: cnt_wait += 1`, then
    `if cnt_wait == patience: break`; each process counted from its own loss, one left
    the loop and the other waited in its next all-reduce (the eighth unseen set)."""
    body = STOP_BODY.format(test="cnt_wait == patience").replace(
        "    if cnt_wait",
        "    if loss < best:\n        best = loss\n        cnt_wait = 0\n"
        "    else:\n        cnt_wait += 1\n    if cnt_wait",
    )
    code, _ = run_step(StopTogether, body)
    assert code.endswith(
        body.replace("if cnt_wait == patience:", "if on_any_rank(cnt_wait == patience):")
    )


def test_a_loop_that_stops_on_a_shared_value_is_left_alone():
    body = STOP_BODY.format(test="step == max_steps")
    code, log = run_step(StopTogether, body)
    assert (code, log.changes, log.skipped) == (body, [], [])


EPOCH_STOP_BODY = """\
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
stopper = EarlyStopping(patience=1)
done = False
for epoch in range(100):
    for x, y in loader:
        output = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        output.backward()
        optimizer.step()
        done = step_count > 10
    val_loss = evaluate(model, val_loader)
    stopper(val_loss)
{stops}
"""


@pytest.mark.parametrize(
    "test, agreed",
    [
        ("stopper.early_stop", True),  # the stopper, fed each process's own loss
        ("val_loss > 1.0", True),
        ("epoch >= max_epochs", False),  # the same on every process
        ("done", False),  # set in the step loop, whose own breaks agree
    ],
)
def test_an_epoch_loop_that_stops_on_what_it_computes_stops_on_every_process_at_once(test, agreed):
    """LTSF-Linear's `early_stopping(vali_loss, ...)` then `if early_stopping.early_stop:
    break`, each process validating its own draw: one left the epoch loop, the other
    waited in its next DDP step (a hang of the seventh unseen set). The print stays
    guarded: `on_any_rank` is no test of this process's rank."""
    stops = f"    if {test}:\n        print('early stopping')\n        break"
    code, _ = run_step(StopTogether, EPOCH_STOP_BODY.format(stops=stops))
    expected = stops.replace(f"if {test}:", f"if on_any_rank({test}):") if agreed else stops
    assert code.endswith(EPOCH_STOP_BODY.format(stops=expected))
    rank_zero = convert_source(SETUP + EPOCH_STOP_BODY.format(stops=expected), DDP).converted
    assert "            print('early stopping')" in rank_zero and "RANK == 0" in rank_zero


def test_a_stop_that_one_process_decides_alone_is_left_alone():
    """A collective under `if RANK == 0:` would wait forever for the others."""
    stops = "    if RANK == 0:\n        if stopper.early_stop:\n            break"
    body = EPOCH_STOP_BODY.format(stops=stops)
    code, log = run_step(StopTogether, body)
    assert (code, log.changes) == (body, [])


# -- printed sizes -------------------------------------------------------------------------
def test_printed_dataset_size_of_a_sharded_loader_is_the_shard_size():
    """pytorch/examples' VAE printed `train_loss / len(train_loader.dataset)`: the sum
    over one shard divided by the whole set, WORLD_SIZE times too small."""
    body = """\
        from torch.utils.data import DataLoader, DistributedSampler
        sampler = DistributedSampler(train_set) if DISTRIBUTED else None
        train_loader = DataLoader(train_set, sampler=sampler)
        test_loader = DataLoader(test_set)
        steps = epochs * len(train_loader.dataset) // 32
        for x, y in train_loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"{total / len(train_loader.dataset):.3f}", len(test_loader.dataset))
        """
    code, log = run_step(PrintShardSizes, body)
    assert code == dedent(body).replace(
        "total / len(train_loader.dataset)", "total / len(train_loader.sampler)"
    )
    assert [c.description for c in log.changes] == [
        "prints the size of this process's shard: `len(train_loader.sampler)`"
    ]


AVERAGES = """\
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
train_set = TensorDataset(inputs, targets)
test_set = TensorDataset(test_inputs, test_targets)
sampler = DistributedSampler(train_set) if DISTRIBUTED else None
train_loader = DataLoader(train_set, batch_size=per_process_batch_size(batch_size), sampler=sampler)
test_loader = DataLoader(test_set)
print(f"{len(train_set)} samples")
for i, (x, y) in enumerate(train_loader, 1):
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    running_loss += loss.item() * len(y)
    print(running_loss / (batch_size * i), 2 * batch_size)
    print(running_loss / batch_size)
print(running_loss / len(train_set), steps / len(train_set))
print(100.0 * correct / len(train_set))
for x, y in test_loader:
    test_loss += criterion(model(x), y).item()
print(test_loss / len(test_set), test_loss / (batch_size * len(test_loader)))
"""


def test_a_printed_average_of_a_training_sum_divides_by_this_processs_counts():
    """L1aoXingyu's CNN printed `running_loss / (batch_size * i)` and `running_loss /
    len(train_dataset)`: sums over rank 0's shard divided by global counts, half the
    original on two processes. Only divisors of a sum the training loop adds to change:
    not `steps` (never summed there), not the evaluation's sum, not a shown count."""
    body = AVERAGES
    code, log = run_step(PrintShardSizes, body)
    assert code == body.replace(
        "running_loss / len(train_set)", "running_loss / len(train_loader.sampler)"
    )
    assert [c.description for c in log.changes] == [
        "divides a sum over this process's shard by its size: `len(train_loader.sampler)`"
    ]
    code, log = run_step(FollowPerProcessBatch, body)
    assert code == body.replace(
        "running_loss / (batch_size * i)", "running_loss / (per_process_batch_size(batch_size) * i)"
    ).replace(
        "print(running_loss / batch_size)",
        "print(running_loss / per_process_batch_size(batch_size))",
    )
    assert len(log.changes) == 2 and log.skipped == []


def test_a_printed_count_of_the_step_s_batch_divides_by_this_processs_batch():
    """A DCGAN-style script printed each step's accuracy as `correct.item() /
    float(args.batch_size)`, `correct` counted over this process's batch: half the
    original on two processes (thirteenth unseen set). A number not made from the batch
    (`steps`) keeps the global size."""
    body = """\
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
train_set = TensorDataset(inputs, targets)
sampler = DistributedSampler(train_set) if DISTRIBUTED else None
loader = DataLoader(train_set, batch_size=per_process_batch_size(args.batch_size), sampler=sampler)
for i, (x, y) in enumerate(loader):
    out = model(x)
    loss = criterion(out, y)
    loss.backward()
    optimizer.step()
    correct = out.argmax(1).eq(y).sum()
    print("accuracy", correct.item() / float(args.batch_size))
    print(steps / args.batch_size)
"""
    code, log = run_step(FollowPerProcessBatch, body)
    assert code == body.replace(
        "float(args.batch_size)", "float(per_process_batch_size(args.batch_size))"
    )
    assert len(log.changes) == 1 and log.skipped == []


def test_a_dataset_size_without_a_readable_loader_stays():
    """The sharded loader is made inside a function: no name at the print holds it."""
    body = """\
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
        train_set = TensorDataset(inputs, targets)


        def make_loader(dataset):
            return DataLoader(dataset, sampler=DistributedSampler(dataset) if DISTRIBUTED else None)


        for x, y in make_loader(train_set):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(total / len(train_set))
        """
    code, log = run_step(PrintShardSizes, body)
    assert (code, log.changes) == (dedent(body), [])


def test_functions_that_run_the_global_model_are_found_through_their_calls():
    """fixtures/ddp/printed_translation.py runs both ways; here, which functions count:
    those that run the module's `model` themselves or through another function, not
    those whose own parameter or variable has the name."""
    from autoaccel.convert.transforms.distributed.compute_before_printing import model_runners

    module = cst.parse_module(dedent("""\
            def translate(x):
                return model(x).argmax()


            def report(x):
                return str(translate(x))


            def evaluate(model, x):
                return model(x)


            def rebuild(x):
                model = make()
                return model(x)


            def count(x):
                return len(x)
            """))
    assert model_runners(module, {"model"}) == {"translate", "report"}


# -- TensorBoard logs ----------------------------------------------------------------------------
def test_tensorboard_writers_are_made_on_rank_zero_only():
    """pytorch-vqvae logs from `train(..., writer)`: every process wrote its own event
    file into the one folder. The other ranks get a writer that does nothing, so every
    call that logs (wherever the writer is passed) stays as it is."""
    body = """\
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter("./logs")
        train(loader, model, writer)
        with SummaryWriter("./logs/final") as final:
            final.add_text("done", "yes")
        SummaryWriter("./logs/x").flush()
        if RANK == 0:
            kept = SummaryWriter("./logs/y")
        """
    code, log = run_step(LogOnRankZero, body)
    assert code.startswith("class NoWriter:\n")
    assert 'writer = SummaryWriter("./logs") if RANK == 0 else NoWriter(log_dir="./logs")\n' in code
    assert (
        "with (\n"
        '    SummaryWriter("./logs/final") if RANK == 0 else NoWriter(log_dir="./logs/final")\n'
        ") as final:\n"
    ) in code
    assert (
        '(SummaryWriter("./logs/x") if RANK == 0 else NoWriter(log_dir="./logs/x")).flush()\n'
        in code
    )
    assert '    kept = SummaryWriter("./logs/y")\n' in code
    assert len(log.changes) == 3


def test_logging_below_warnings_comes_from_rank_zero_only():
    """mnist-gradient-accumulation (eighth unseen set): `logging.info("Saved best
    model")` on every process, though only rank 0 saves; warnings still come from all."""
    body = """\
        import logging
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        if RANK == 0:
            logging.basicConfig(level=logging.DEBUG)
        logging.basicConfig(level=logging.INFO if RANK == 0 else logging.ERROR)
        """
    code, log = run_step(LogOnRankZero, body)
    assert (
        "logging.basicConfig(\n"
        '    level=logging.INFO if RANK == 0 else logging.WARNING, format="%(message)s"\n'
        ")\n"
        "if RANK == 0:\n    logging.basicConfig(level=logging.DEBUG)\n"
        "logging.basicConfig(level=logging.INFO if RANK == 0 else logging.ERROR)\n"
    ) in code
    assert len(log.changes) == 1


def test_the_writer_of_the_other_ranks_tells_the_folder_of_rank_zeros():
    """pytorch-semseg saves its best model (on rank 0) into `writer.file_writer.get_logdir()`,
    which every process computes: a `NoWriter()` there made rank 1 fail in `os.path.join`."""
    body = "from torch.utils.tensorboard import SummaryWriter\nwriter = SummaryWriter(log_dir=logdir)\n"
    code, _ = run_step(LogOnRankZero, body)
    assert (
        "writer = SummaryWriter(log_dir=logdir) if RANK == 0 else NoWriter(log_dir=logdir)\n"
        in code
    )
    namespace: dict = {}
    exec(code[: code.index("\n\n\n")], namespace)  # the helper's class
    writer = namespace["NoWriter"](log_dir="runs/7")
    assert writer.file_writer.get_logdir() == writer.get_logdir() == writer.log_dir == "runs/7"
    assert writer.add_scalar("loss", 1.0, 3) is writer  # and logs nothing
    namespace: dict = {}
    exec(code[: code.index("\n\n\n")], namespace)
    with namespace["NoWriter"]() as quiet:
        quiet.add_scalar("loss", 1.0, 0)
        quiet.config.update({"lr": 0.1})  # a wandb run's attributes do nothing either
        quiet.config["lr"] = quiet.summary["best"]
        quiet.name = "baseline"


# -- random numbers per process --------------------------------------------------------------
SEEDED = """\
torch.manual_seed(args.seed)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# training
for epoch in range(2):
    for x, y in loader:
        noise = torch.randn_like(x)
        loss = (model(x + noise) - y).pow(2).mean()
        loss.backward()
        optimizer.step()
"""


def test_each_process_is_reseeded_with_its_rank_before_training():
    """pytorch/examples' dcgan drew the same noise on every process: the global batch
    held 1/WORLD_SIZE as many distinct samples. The model and data are built first, the
    same on every process; the comments above the loop stay above the inserted block."""
    code, log = run_step(SeedEachRank, SEEDED)
    assert code == SEEDED.replace(
        "# training\n",
        "# training\n"
        "# Same model and data on every process so far; from here each draws its own random\n"
        "# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.\n"
        "if DISTRIBUTED:\n"
        "    torch.manual_seed(torch.initial_seed() + RANK)\n",
    )
    assert [c.description for c in log.changes] == [
        "each process re-seeded with seed + RANK before training"
    ]


@pytest.mark.parametrize(
    "seed", ["", "torch.manual_seed(args.seed + rank)\n"], ids=["unseeded", "seeded-per-rank"]
)
def test_scripts_whose_processes_already_differ_are_left_alone(seed):
    body = SEEDED.replace("torch.manual_seed(args.seed)\n", seed)
    code, log = run_step(SeedEachRank, body)
    assert (code, log.changes, log.skipped) == (body, [], [])


# -- summed losses -------------------------------------------------------------------------
SUMMED = """\
model = torch.nn.Linear(4, 2)
criterion = torch.nn.MSELoss({reduction})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""


def test_a_summed_training_loss_is_multiplied_by_world_size():
    """DDP averages gradients, so with each process summing its share of the global batch
    every update would be 1/WORLD_SIZE of the original's (pytorch/examples' VAE sums)."""
    body = SUMMED.format(reduction='reduction="sum"')
    code, log = run_step(ScaleSummedLoss, body)
    assert code == body.replace(
        "loss.backward()", "(loss * WORLD_SIZE).backward()  # a sum: DDP averages over processes"
    )
    (change,) = log.changes
    assert change.line == SETUP.count("\n") + 6 and "multiplied by WORLD_SIZE" in change.description


@pytest.mark.parametrize(
    "reduction, options",
    [
        ("", DDP),
        ('reduction="mean"', DDP),
        ('reduction="sum"', ConvertOptions(target="ddp", amp="off", per_process_batch=True)),
    ],
    ids=["default-mean", "mean", "sum-per-process-batch"],
)
def test_averaged_losses_keep_their_scale(reduction, options):
    body = SUMMED.format(reduction=reduction)
    code, log = run_step(ScaleSummedLoss, body, options)
    assert (code, log.changes, log.skipped) == (body, [], [])


VAE_LOSS = """\
import torch.nn.functional as F
def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return {returned}
for x, _ in loader:
    recon, mu, logvar = model(x)
    loss = loss_function(recon, x, mu, logvar)
    optimizer.zero_grad()
    {backward}
    optimizer.step()
"""


@pytest.mark.parametrize(
    "backward, scaled",
    [
        ("loss.backward()", "(loss * WORLD_SIZE).backward()"),
        ("scaler.scale(loss).backward()", "scaler.scale(loss * WORLD_SIZE).backward()"),
    ],
)
def test_a_sum_returned_by_a_loss_function_is_followed(backward, scaled):
    """The VAE's loss: a summed BCE plus a KL term summed with `torch.sum`, returned by a
    function of the script; also through `GradScaler.scale`."""
    body = VAE_LOSS.format(returned="bce + kld", backward=backward)
    code, log = run_step(ScaleSummedLoss, body)
    assert code == body.replace(backward, scaled + "  # a sum: DDP averages over processes")


@pytest.mark.parametrize(
    "returned", ["bce + kld.mean()", "bce / args.batch_size", "bce + kld * bce"]
)
def test_a_sum_mixed_with_other_terms_is_refused(returned):
    """A sum plus a mean, a sum divided by a constant that may be the global batch: no
    single factor restores the original's gradient."""
    body = VAE_LOSS.format(returned=returned, backward="loss.backward()")
    code, log = run_step(ScaleSummedLoss, body)
    assert code == body
    (skip,) = log.skipped
    assert skip.what == "summed loss" and skip.wrong and skip.line == SETUP.count("\n") + 10


@pytest.mark.parametrize("returned", ["bce / len(x)", "bce / x.size(0)", "F.mse_loss(recon_x, x)"])
def test_a_sum_divided_by_its_own_batch_is_a_mean(returned):
    body = VAE_LOSS.format(returned=returned, backward="loss.backward()")
    code, log = run_step(ScaleSummedLoss, body)
    assert (code, log.changes, log.skipped) == (body, [], [])


def test_a_summed_metric_that_is_not_the_loss_is_left_alone():
    body = """\
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += F.mse_loss(model(x), y, reduction="sum").item()
            correct += (model(x).argmax(1) == y).sum().item()
        """
    code, log = run_step(ScaleSummedLoss, body)
    assert (code, log.changes, log.skipped) == (dedent(body), [], [])


# -- the ddp-tutorial shape ------------------------------------------------------------------
def test_trainer_methods_gets_what_the_tutorials_own_ddp_version_has():
    """fixtures/trainer_methods.py has the shape of pytorch/examples' ddp-tutorial-series
    `single_gpu.py`; the maintainers' `multigpu_torchrun.py` is what a person makes of it.
    Point by point (their version / this conversion, `tests/snapshots/trainer_methods.ddp.py`):

    1. `ddp_setup()`: `init_process_group(backend="nccl")` and `set_device(LOCAL_RANK)` in
       `main` / a set-up block after the imports: gloo or nccl by device, `set_device` on CUDA,
       and nothing at all under plain `python`.
    2. `self.model = DDP(self.model, device_ids=[gpu_id])` in `Trainer.__init__` / the same
       place, as `self.ddp_model`, which the forward pass in `_run_batch` calls;
       `self.model` stays the bare module.
    3. `DataLoader(..., shuffle=False, sampler=DistributedSampler(dataset))` in
       `prepare_dataloader` / the same, the shuffle moved into the sampler, the global batch
       kept (`per_process_batch_size`).
    4. `self.train_data.sampler.set_epoch(epoch)` in `_run_epoch` / at the top of the epoch
       loop in `train`, before `_run_epoch(epoch)`: the same call, once per epoch.
    5. `if self.gpu_id == 0 and epoch % save_every == 0: self._save_checkpoint(epoch)` with
       `self.model.module.state_dict()` / `_save_checkpoint` returns early on ranks other than
       0 and saves `self.model.state_dict()`: the same keys, no `module.` prefix.
    6. `destroy_process_group()` at the end of `main` / at the end of the script.
    Beyond theirs: prints on rank 0 only, each rank re-seeded with seed + RANK before training.
    """
    code = (SNAPSHOTS / "trainer_methods.ddp.py").read_text(encoding="utf-8")
    init = code[
        code.index("    def __init__(self, model, train_data") : code.index("    def _run_batch")
    ]
    assert "self.ddp_model = DDP(\n                self.model," in init
    assert "output = self.ddp_model(source)" in code
    loader = code[code.index("def prepare_dataloader") : code.index("def main")]
    assert "sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None" in loader
    assert "shuffle=sampler is None," in loader and "sampler=sampler," in loader
    train = code[code.index("    def train(self, max_epochs)") : code.index("def load_train_objs")]
    assert train.index("self.train_data.sampler.set_epoch(epoch)") < train.index(
        "self._run_epoch(epoch)"
    )
    save = code[code.index("    def _save_checkpoint") : code.index("    def train(")]
    assert save.index("if RANK != 0:") < save.index("torch.save(self.model.state_dict()")
    assert code.rstrip().endswith("        gc.collect()\n        dist.destroy_process_group()")


# -- the batch size in the step ----------------------------------------------------------------
BATCH_SHAPES = """\
from torch.utils.data import DataLoader
loader = DataLoader(dataset, batch_size=per_process_batch_size(batch_size))
for images, _ in loader:
    images = images.reshape(batch_size, -1)
    labels = torch.ones(batch_size, 1)
    noise = torch.randn((batch_size, 8))
    loss = criterion(model(images) + noise.mean(), labels)
    loss.backward()
    optimizer.step()
    print(f"{batch_size} images", batch_size)
"""


def test_shapes_built_from_the_batch_size_follow_the_per_process_batch():
    """yunjey's GAN shaped images, labels and noise by the global `batch_size`: a shape
    error on every process once the loader loads its share. Prints keep the variable."""
    code, log = run_step(FollowPerProcessBatch, BATCH_SHAPES)
    assert code == BATCH_SHAPES.replace(
        "(batch_size, -1)", "(per_process_batch_size(batch_size), -1)"
    ).replace("(batch_size, 1)", "(per_process_batch_size(batch_size), 1)").replace(
        "((batch_size, 8))", "((per_process_batch_size(batch_size), 8))"
    )
    assert [c.line - SETUP.count("\n") for c in log.changes] == [4, 5, 6]
    assert log.skipped == []


def test_another_use_of_the_batch_size_in_the_step_is_refused():
    body = BATCH_SHAPES.replace(
        "    loss.backward()\n", "    loss = loss * 256 / batch_size\n    loss.backward()\n"
    )
    code, log = run_step(FollowPerProcessBatch, body)
    (skip,) = log.skipped
    assert skip.wrong and skip.what == "per-process batch" and skip.line == SETUP.count("\n") + 8
    assert "`--per-process-batch`" in skip.reason


def test_per_process_batch_keeps_the_batch_size():
    body = BATCH_SHAPES.replace("per_process_batch_size(batch_size)", "batch_size")
    code, log = run_step(
        FollowPerProcessBatch, body, ConvertOptions(target="ddp", amp="off", per_process_batch=True)
    )
    assert (code, log.changes, log.skipped) == (body, [], [])


# -- fresh random batches ------------------------------------------------------------------------
FRESH = """\
torch.manual_seed(0)
W = torch.randn(4, 1)


def get_batch(batch_size=32):
    x = torch.randn(batch_size, 4)
    return x, x @ W


model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    x, y = get_batch()
    loss = (model(x) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize(
    "seeding, refused",
    [("torch.manual_seed(0)", True), ("torch.manual_seed(RANK)", False), ("seed = None", False)],
    ids=["seeded-alike", "seeded-per-rank", "unseeded"],
)
def test_fresh_random_batches_need_no_sampler_when_each_process_draws_its_own(seeding, refused):
    """pytorch/examples' regression samples a new batch every step: with its own random
    stream each process draws other batches, which is what a sampler would give."""
    body = FRESH.replace("torch.manual_seed(0)", seeding)
    code, log = run_step(ShardTrainLoader, body)
    assert code == body
    (skip,) = log.skipped
    assert skip.wrong is refused and skip.line == SETUP.count("\n") + 12
    assert ("seeds its generator alike" in skip.reason) is refused


def test_a_loop_slicing_fixed_data_is_not_fresh_data():
    body = FRESH.replace(
        "    x, y = get_batch()\n",
        "    x, y = data[step:step + 8], targets[step:step + 8]\n    x = x + 0.1 * torch.randn_like(x)\n",
    )
    _, log = run_step(ShardTrainLoader, body.replace("torch.manual_seed(0)", "seed = None"))
    assert log.skipped == []  # the loop's batches are shared out by rounds (ShardBatchRounds)


# -- evaluation on a share per process -------------------------------------------------------
EVALUATE = """\
from torch.utils.data import DataLoader
test_loader = DataLoader(test_set, batch_size=64)


def test(model, loader):
    test_loss, correct = 0, 0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(1).eq(target).sum().item()
    return test_loss / len(loader.dataset), correct


for epoch in range(2):
    for x, y in train_loader:
        loss = F.nll_loss(model(x), y)
        loss.backward()
        optimizer.step()
    test_loss, correct = test(model, test_loader)
"""


def test_an_evaluation_of_sums_runs_on_a_share_per_process_and_adds_up():
    """pytorch/examples' mnist shape: a summed loss and a count. Each process sums every
    WORLD_SIZE-th sample (no padding: none counts twice) and the sums are all-reduced."""
    code, log = run_step(ShardEvaluation, EVALUATE)
    assert "def all_reduce_sums(*sums):" in code
    assert (
        "DataLoader(\n    test_set,\n    batch_size=64,\n    sampler=range(RANK, len(test_set), WORLD_SIZE) if DISTRIBUTED else None,\n)"
        in code
    )
    assert (
        "            correct += output.argmax(1).eq(target).sum().item()\n"
        "        if DISTRIBUTED:  # each process evaluated its share: add up\n"
        "            test_loss, correct = all_reduce_sums(test_loss, correct)\n"
    ) in code
    (change,) = log.changes
    assert "its sums (test_loss, correct) added up" in change.description


@pytest.mark.parametrize(
    "edit",
    [
        ('reduction="sum").item()', ").item()"),  # a mean of batch means
        (
            "            correct +=",
            "            predictions.append(output)\n            correct +=",
        ),
        ("test_loss, correct = test(model, test_loader)", "print(test(model, test_loader))"),
        (
            "DataLoader(test_set, batch_size=64)",
            "DataLoader(test_set, batch_size=64, shuffle=True)",
        ),
        (
            "            output = model(data)\n",
            "            output = model(data)\n            if correct > 100:\n                break\n",
        ),
    ],
    ids=["mean-of-means", "kept-predictions", "called-in-a-print", "shuffled", "break"],
)
def test_other_evaluations_stay_on_the_whole_set(edit):
    body = EVALUATE.replace(*edit)
    code, log = run_step(ShardEvaluation, body)
    assert (code, log.changes) == (body, [])


TWO_SETS = EVALUATE.replace(
    "test_loader = DataLoader(test_set, batch_size=64)\n",
    "dev_loader = DataLoader(dev_set, batch_size=64)\ntest_loader = DataLoader(test_set, batch_size=64)\n",
).replace(
    "    test_loss, correct = test(model, test_loader)\n",
    "    dev_loss, dev_correct = test(model, dev_loader)\n    test_loss, correct = test(model, test_loader)\n",
)


def test_one_evaluation_of_two_sets_adds_up_once():
    """Shawn1993's cnn-text-classification evaluates its dev and test sets with one
    `eval()`: one all-reduce after its loop, not one per set."""
    code, log = run_step(ShardEvaluation, TWO_SETS)
    assert code.count("= all_reduce_sums(test_loss, correct)") == 1
    assert code.count("sampler=range(RANK, len(") == 2
    assert len(log.changes) == 1


def test_an_evaluation_of_a_set_that_cannot_be_shared_adds_up_none():
    """The shuffled dev set keeps its whole set: the sums of `test()` over it must not be
    added up over the processes, so the test set stays whole too."""
    body = TWO_SETS.replace(
        "DataLoader(dev_set, batch_size=64)", "DataLoader(dev_set, batch_size=64, shuffle=True)"
    )
    code, log = run_step(ShardEvaluation, body)
    assert (code, log.changes) == (body, [])


def test_a_printed_size_follows_the_loader_it_reads_not_its_spelling():
    """`loader` is the sharded training loader at module level and, as a parameter of
    `evaluate`, the whole evaluation set: only the module-level print changes."""
    body = """\
        from torch.utils.data import DataLoader, DistributedSampler
        sampler = DistributedSampler(train_set) if DISTRIBUTED else None
        loader = DataLoader(train_set, sampler=sampler)


        def evaluate(loader):
            print(len(loader.dataset))


        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(total / len(loader.dataset))
        evaluate(DataLoader(test_set))
        """
    code, log = run_step(PrintShardSizes, body)
    assert code == dedent(body).replace(
        "print(total / len(loader.dataset))", "print(total / len(loader.sampler))"
    )
    assert len(log.changes) == 1


# -- a sampler of independent draws -------------------------------------------------------------
REPLACEMENT = """\
import torch
from torch.utils.data import DataLoader
loader = DataLoader(
    train_set,
    sampler=torch.utils.data.RandomSampler(train_set, replacement=True, num_samples=int(1e10)),
    batch_size=64,
)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""


def test_a_sampler_drawing_with_replacement_is_kept_and_each_process_draws_its_share():
    """minGPT's trainer: i.i.d. draws from the global stream. Each process draws its own
    (the stream is re-seeded with its rank), so only the batch is divided; listing 1e10
    indices to share them out would not fit in memory."""
    code, log = run_step(ShardTrainLoader, REPLACEMENT)
    assert "    batch_size=per_process_batch_size(64),\n" in code
    assert "RandomSampler(train_set, replacement=True, num_samples=int(1e10))," in code
    assert "DistributedSampler" not in code
    (change,) = log.changes
    assert "draws with replacement" in change.description and log.skipped == []


def test_a_sampler_of_its_own_generator_is_refused():
    """With its own generator every process would draw the same samples."""
    body = REPLACEMENT.replace("num_samples=int(1e10)", "num_samples=int(1e10), generator=g")
    code, log = run_step(ShardTrainLoader, body)
    (skip,) = log.skipped
    assert skip.wrong and "already has a sampler" in skip.reason


def test_a_barrier_in_a_module_the_script_imports_brings_its_import():
    """PPO's `PPO.load()` got `torch_dist.barrier()` in a module that never imported
    `torch.distributed`: a NameError on every process (the script starts the group, the
    module only has the names)."""
    from autoaccel.convert.transforms.distributed.init_process_group import MODULE_NAMES

    body = 'if RANK == 0:\n    torch.save(model.state_dict(), "m.pt")\nmodel.load_state_dict(torch.load("m.pt"))\n'
    code = apply(
        LoadOnEveryRank, "import os\n\nimport torch\n" + MODULE_NAMES + body, DDP, ConversionLog()
    )
    assert (
        "import torch\nimport torch.distributed as dist\n" in code and "    dist.barrier()" in code
    )


def test_a_folder_is_made_on_every_process():
    """PPO makes its log folder, then lists it to number its runs: made on rank 0 only,
    rank 1 listed a folder that was not there yet (StopIteration in 2 of 5 runs)."""
    code, log = run_step(
        GuardRankZero,
        """\
        if not os.path.exists(log_dir):
            os.makedirs(log_dir)
        os.makedirs(os.path.join(log_dir, "ckpt"), exist_ok=True)
        run_num = len(next(os.walk(log_dir))[2])
        torch.save(model.state_dict(), os.path.join(log_dir, f"model_{run_num}.pt"))
        """,
    )
    assert code.startswith(
        "if not os.path.exists(log_dir):\n    os.makedirs(log_dir, exist_ok=True)\n"
        'os.makedirs(os.path.join(log_dir, "ckpt"), exist_ok=True)\n'
        "run_num = len(next(os.walk(log_dir))[2])\nif RANK == 0:\n"
    )
    assert (
        len([c for c in log.changes if c.description.startswith("folder made on every process")])
        == 1
    )


HOST_DRAWN = """\
import numpy as np
import torch

torch.manual_seed(0)
np.random.seed(0)
data = torch.randn(64, 4)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    rows = np.random.randint(0, 64, size=16)
    loss = model(data[rows]).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_host_generator_the_script_seeds_and_trains_with_is_reseeded_by_rank():
    """SincNet (eighth unseen set): `np.random.seed(seed)`, then every step's batch drawn
    with `np.random`: all processes drew the same batches (the proof refused), and the
    conversion asked for a seed by hand. Its stream is now offset by the rank too."""
    conversion = convert_source(HOST_DRAWN, DDP)
    assert (
        "    np.random.seed((int(np.random.get_state()[1][0]) + RANK) % 2**32)\n"
        in conversion.converted
    )
    assert not [s for s in conversion.log.skipped if s.wrong]
    untouched = HOST_DRAWN.replace(
        "np.random.randint(0, 64, size=16)", "torch.randint(0, 64, (16,))"
    )
    assert (
        "np.random.get_state" not in convert_source(untouched, DDP).converted
    )  # not drawn in training


# -- buffers that never change -----------------------------------------------------------------
CONSTANT_BUFFER = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "constant_buffer.py"


@pytest.mark.parametrize(
    ("change", "constant"),
    [
        ((), True),
        (("        return x + self.pe", "        self.pe.mul_(1.0)\n        return x + self.pe"), False),
        (("self.head = nn.Linear(width, 1)", "self.head = nn.Sequential(nn.BatchNorm1d(12), nn.Linear(width, 1))"), False),
        (('self.register_buffer("pe", pe)', "self.register_buffer(NAME, pe)"), False),
    ],
    ids=["constant", "changed-in-place", "running-statistics", "name-not-literal"],
)  # fmt: skip
def test_buffers_that_never_change_are_not_broadcast(change, constant):
    """A positional encoding registered as a strided view (`pe.unsqueeze(0).transpose(0,
    1)`, eleventh unseen set) failed DDP's broadcast of the buffers at every forward; one
    that nothing changes needs none. Any buffer that may change keeps the default."""
    source = CONSTANT_BUFFER.read_text()
    if change:
        source = source.replace(*change)
    code = convert_source(source, DDP, str(CONSTANT_BUFFER)).converted
    assert ("        broadcast_buffers=False,\n" in code) is constant
    assert ("# (`pe` never changes in training: no broadcast" in code) is constant


def test_a_method_that_computes_nothing_is_called_on_the_model_itself():
    """fixtures/ddp/init_hidden_method.py: `train(model, ...)` gets the wrapper and calls
    `model.init_hidden(n)` (zeros shaped by `self.hidden`, an int): called on the model
    itself. `sample(model)` in the rank-0 print takes the bare model there too, not hoisted
    out of the print (it runs no collective)."""
    path = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "init_hidden_method.py"
    conversion = convert_source(path.read_text(), DDP, "train.py")
    assert [s.reason for s in conversion.log.skipped if s.wrong] == []
    text = conversion.converted
    assert "logits, _ = model(tokens, unwrapped(model).init_hidden(tokens.size(0)))" in text
    assert 'f"epoch {epoch} loss {loss.item():.4f} sample {sample(unwrapped(model))}"' in text
    computing = path.read_text().replace(
        "        zeros = torch.zeros(1, batch_size, self.hidden)\n",
        "        zeros = self.head.weight.new_zeros(1, batch_size, self.hidden)\n",
    )
    refused = convert_source(computing, DDP, "train.py").log.skipped
    assert any("init_hidden" in s.reason for s in refused if s.wrong)


def test_the_per_process_reseed_runs_once_where_training_starts():
    """fixtures/ddp/epoch_function.py: the step loop is in `train_one_epoch()`, called once
    per epoch by `fit()`; the re-seed goes before `fit(loader, teacher)` in `main()`, not
    into `train_one_epoch()`, where every epoch drew the same noise again. The epoch's
    training, called inside the print, runs on every process before the rank-0 print (the
    whole print went under the guard: rank 1 never trained)."""
    path = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "epoch_function.py"
    text = convert_source(path.read_text(), DDP, "train.py").converted
    assert text.count("torch.manual_seed(torch.initial_seed() + RANK)") == 1
    assert (
        "    if DISTRIBUTED:\n        torch.manual_seed(torch.initial_seed() + RANK)\n"
        "    fit(loader, teacher)\n"
    ) in text
    assert (
        "        train_one_epoch_result = train_one_epoch(loader, model, criterion, optimizer)\n"
        "        if RANK == 0:\n"
        '            print(f"epoch {epoch} loss {train_one_epoch_result:.4f}")\n'
    ) in text


def test_a_helper_training_several_models_waits_for_no_unused_layer():
    """kd's `fit(loader, model)` trains a teacher whose `norm` layer forward never uses, then
    a student (a `Sequential`): the name `model` holds both, and the layers any of them
    leaves out get `find_unused_parameters=True` (DDP waited for `norm`'s gradient and the
    second step raised; the proof caught it)."""
    source = dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset


        class Teacher(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(10, 2)
                self.norm = nn.BatchNorm1d(2)  # never used

            def forward(self, x):
                return self.fc(x)


        def fit(loader, model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()


        loader = DataLoader(TensorDataset(torch.randn(32, 10), torch.randint(0, 2, (32,))), batch_size=8)
        fit(loader, Teacher())
        fit(loader, nn.Sequential(nn.Linear(10, 2)))
        """)
    conversion = convert_source(source, DDP, "train.py")
    assert "find_unused_parameters=True" in conversion.converted
    assert "# (`norm` gets no gradient: DDP must not wait for it)" in conversion.converted
