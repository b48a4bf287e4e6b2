"""The script model on its own: what it finds in top-level code, functions and classes."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper

from autoaccel.analysis.script_model import (
    LoopRole,
    Missing,
    ScriptModel,
    Unknown,
    build_script_model,
)

HEADER = "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n"


def model_of(source: str) -> ScriptModel:
    module = cst.parse_module(HEADER + textwrap.dedent(source))
    return build_script_model(MetadataWrapper(module, unsafe_skip_copy=True))


def loader_call(script: ScriptModel, key: str) -> cst.Call:
    (call,) = script.loaders[key]
    return call


def test_loaders_top_level_function_and_class():
    script = model_of("""
        train_loader = DataLoader(ds, batch_size=8)
        def make(ds):
            val_loader = DataLoader(ds)
            return val_loader
        class Trainer:
            def __init__(self, ds):
                self.loader = DataLoader(ds)
        """)
    assert set(script.loaders) == {"train_loader", "val_loader", "self.loader"}
    assert len(script.loader_calls) == 3


def test_aliases_and_arguments_carry_the_facts():
    script = model_of("""
        loader = DataLoader(ds)
        net = nn.Linear(4, 2).cuda()
        def fit(model, data):
            pass
        fit(net, loader)
        class Trainer:
            def __init__(self, model):
                self.model = model
        trainer = Trainer(net)
        """)
    assert {"net", "model", "self.model"} <= script.models
    assert "data" in script.loaders


def test_names_are_scoped_not_spelled():
    # `fit`'s `model` parameter is bound only by its call sites; a class that is never
    # built gets nothing from a same-named parameter elsewhere.
    script = model_of("""
        net = nn.Linear(4, 2)
        def fit(model):
            pass
        fit(net)
        class Report:
            def __init__(self, model):
                self.model = model
        """)
    assert "model" in script.models
    assert "self.model" not in script.models


def test_models_optimizers_criteria():
    script = model_of("""
        class Net(nn.Module):
            pass
        model = Net().to(device)
        backbone = nn.Conv2d(3, 8, 3)
        head = nn.Linear(8, 2)
        opt = torch.optim.SGD(head.parameters(), lr=0.1)
        criterion = nn.CrossEntropyLoss()
        """)
    assert {"model", "backbone", "head"} <= script.models
    assert script.optimizers == {"opt"}
    assert script.criteria == {"criterion"}
    assert script.has_convolutions


@pytest.mark.parametrize(
    "assignment",
    [
        "device = torch.device('cuda')",
        "device = 'cuda:0'",
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'",
        "device = args.device or 'cuda'",
    ],
)
def test_devices(assignment):
    assert "device" in model_of(assignment + "\n").devices


def test_not_a_device():
    assert model_of("name = 'resnet'\ndevice = args.device\n").devices == set()


def test_uses_cuda():
    assert model_of("x = y.cuda()\n").uses_cuda
    assert model_of("x = y.to('cuda:1')\n").uses_cuda
    assert not model_of("x = y.to('cpu')\n").uses_cuda
    # a checkpoint saved on a GPU, loaded where the script runs: no use of CUDA
    assert not model_of("state = torch.load(p, map_location={'cuda:0': 'cpu'})\n").uses_cuda


def test_train_and_eval_step_loops_and_epochs():
    script = model_of("""
        train_loader = DataLoader(ds)
        test_loader = DataLoader(ds)
        for epoch in range(3):
            for step, (x, y) in enumerate(train_loader):
                loss = model(x).sum()
                loss.backward()
        for x, y in test_loader:
            out = model(x)
        for item in other:
            print(item)
        """)
    roles = {loop.loader: loop.role for loop in script.step_loops.values()}
    assert roles == {"train_loader": LoopRole.TRAIN, "test_loader": LoopRole.EVAL}
    train = next(loop for loop in script.step_loops.values() if loop.role is LoopRole.TRAIN)
    assert train.batch_names == {"step", "x", "y"}
    (epoch,) = script.epoch_loops
    assert isinstance(epoch, cst.For) and epoch.target.value == "epoch"  # type: ignore[union-attr]


def test_while_loop_that_trains_is_a_step_loop():
    script = model_of("while True:\n    loss = step()\n    loss.backward()\n")
    (loop,) = script.step_loops.values()
    assert isinstance(loop.node, cst.While) and loop.role is LoopRole.TRAIN


def test_backward_after_the_loop_body_does_not_make_it_train():
    script = model_of("for x in items:\n    pass\nelse:\n    loss.backward()\n")
    assert script.step_loops == {}


def test_data_parallel_models_and_their_aliases():
    script = model_of("""
        model = nn.DataParallel(Net()).cuda()
        class Trainer:
            def __init__(self):
                self.net = model
        """)
    assert script.data_parallel == {"model", "self.net"}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("kw = {'num_workers': 4}\n", "4"),
        ("kw = dict(num_workers=2)\n", "2"),
        ("kw = {}\nkw['num_workers'] = 3\n", "3"),
        ("kw = {}\nkw.update(num_workers=5)\n", "5"),
        ("base = {'num_workers': 6}\nkw = {**base}\n", "6"),
    ],
)
def test_keyword_through_kwargs_at_top_level(source, expected):
    script = model_of(source + "loader = DataLoader(ds, **kw)\n")
    value = script.keyword(loader_call(script, "loader"), "num_workers")
    assert isinstance(value, cst.Integer) and value.value == expected


def test_keyword_through_kwargs_in_a_function_and_a_class():
    script = model_of("""
        def make(ds):
            kwargs = {"pin_memory": True}
            kwargs.update(num_workers=4)
            return DataLoader(ds, **kwargs)
        class Data:
            def __init__(self, ds):
                self.kw = {"num_workers": 2}
                self.loader = DataLoader(ds, **self.kw)
        """)
    (made,) = [c for c in script.loader_calls if c not in script.loaders.get("self.loader", [])]
    assert isinstance(script.keyword(made, "num_workers"), cst.Integer)
    assert isinstance(script.keyword(made, "pin_memory"), cst.Name)
    value = script.keyword(loader_call(script, "self.loader"), "num_workers")
    assert isinstance(value, cst.Integer) and value.value == "2"


def test_keyword_missing_written_and_unknown():
    script = model_of("""
        a = DataLoader(ds, num_workers=1)
        b = DataLoader(ds)
        c = DataLoader(ds, **options)
        kw = make_options()
        d = DataLoader(ds, **kw)
        """)
    assert isinstance(script.keyword(loader_call(script, "a"), "num_workers"), cst.Integer)
    assert script.keyword(loader_call(script, "b"), "num_workers") is Missing.MISSING
    assert script.keyword(loader_call(script, "c"), "num_workers") is Unknown.UNKNOWN
    assert script.keyword(loader_call(script, "d"), "num_workers") is Unknown.UNKNOWN


def test_a_users_own_dataloader_is_not_a_loader():
    module = cst.parse_module("from mylib import DataLoader\nloader = DataLoader(ds)\n")
    script = build_script_model(MetadataWrapper(module, unsafe_skip_copy=True))
    assert script.loaders == {} and script.loader_calls == []


def test_functional_results_are_not_models():
    script = model_of("""
        import torch.nn.functional as F
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)
            def forward(self, x):
                x = F.relu(x)
                return self.fc(x)
        """)
    assert "x" not in script.models
    assert "self.fc" in script.models


@pytest.mark.parametrize(
    "assignment",
    [
        "device = torch.accelerator.current_accelerator()",
        "device = torch.accelerator.current_accelerator() if torch.accelerator.is_available()"
        ' else torch.device("cpu")',
    ],
)
def test_accelerator_api_devices(assignment):
    script = model_of(assignment + "\n")
    assert "device" in script.devices
    assert script.uses_cuda


def test_step_through_functions_evaluation_first_and_a_loss_module():
    """The shapes of fixtures/step_functions.py, reduced: the loader loop that reaches
    backward() through `train_step` trains; `evaluate`'s loop, run first, evaluates; the
    script's own `FocalLoss` is a criterion, not a model; loaders come from a helper."""
    script = model_of("""
        class FocalLoss(nn.Module):
            def forward(self, logits, targets):
                return logits.sum() * 0 + targets.sum()

        def make_loaders():
            return DataLoader(train_ds, shuffle=True), DataLoader(val_ds)

        def train_step(net, optimizer, criterion, x, y):
            loss = criterion(net(x), y)
            loss.backward()
            optimizer.step()

        def evaluate(net, loader):
            for x, y in loader:
                net(x)

        def train_epoch(net, optimizer, criterion, loader):
            batches = loader
            for x, y in batches:
                train_step(net, optimizer, criterion, x, y)

        net = nn.Linear(4, 2)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        criterion = FocalLoss()
        train_loader, val_loader = make_loaders()
        evaluate(net, val_loader)
        for epoch in range(2):
            train_epoch(net, optimizer, criterion, train_loader)
        """)
    roles = {loop.loader: loop.role for loop in script.step_loops.values()}
    assert roles == {"batches": LoopRole.TRAIN, "loader": LoopRole.EVAL}
    train = next(loop for loop in script.step_loops.values() if loop.role is LoopRole.TRAIN)
    assert [f.name for f in train.step_functions] == ["train_step"]
    (shuffled,) = [loader.node for loader in train.loaders]
    assert any(arg.keyword and arg.keyword.value == "shuffle" for arg in shuffled.args)
    assert script.models == {"net"} and script.criteria == {"criterion"}
    (epoch,) = script.epoch_loops  # around the call of the function that holds the step
    assert epoch.target.value == "epoch"  # type: ignore[union-attr]


def test_a_loop_over_chunks_of_the_batch_is_a_micro_step():
    script = model_of("""
        for x, y in DataLoader(ds):
            for part in x.chunk(4):
                model(part).sum().backward()
            optimizer.step()
        """)
    (step,) = script.step_loops.values()
    (micro,) = script.micro_loops
    assert isinstance(step.node.iter, cst.Call) and step.micro_loops == (micro,)
