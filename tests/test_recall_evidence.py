"""Findings that follow evidence across helpers and modules (issue 31's recall misses), and
the host copies a step needs, which are no finding. Each test is a minimal script of its
own with the shape of a miss or false alarm measured on research code."""

from __future__ import annotations

import json
from textwrap import dedent

from autoaccel.config import LintSettings
from autoaccel.lint.engine import lint_source


def lines(source: str, code: str) -> list[int]:
    found = lint_source(dedent(source), LintSettings(select=(code,)))
    return [d.line for d in found if d.code == code]


def project(cli, tmp_path, files: dict[str, str], *paths: str) -> list[tuple[str, int, str]]:
    for name, text in files.items():
        (tmp_path / name).write_text(dedent(text))
    run = cli("lint", "--format", "json", "--exit-zero", *paths)
    return [(d["filename"], d["location"]["row"], d["code"]) for d in json.loads(run.stdout)]


# -- ACC103: a device that is the accelerator when there is one ---------------------------
ACCELERATOR_OR_CPU = """\
import torch
from torch.utils.data import DataLoader


def train(model, device, loader, optimizer):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    if torch.accelerator.is_available():
        device = torch.accelerator.current_accelerator()
    else:
        device = torch.device("cpu")
    loader = DataLoader(data, batch_size=64, pin_memory=True)
    model = Net().to(device)
    train(model, device, loader, torch.optim.SGD(model.parameters(), lr=0.1))


main()
"""


def test_acc103_current_accelerator_with_a_cpu_fallback_is_the_accelerator_path():
    assert lines(ACCELERATOR_OR_CPU, "ACC103") == [7, 7]


def test_acc103_the_same_script_on_the_cpu_alone_is_not_reported():
    cpu_only = ACCELERATOR_OR_CPU.replace("torch.accelerator.current_accelerator()", 'torch.device("cpu")')
    assert lines(cpu_only, "ACC103") == []


def test_acc103_copies_in_a_comprehension_over_the_batch():
    source = """\
    import torch
    from torch.utils.data import DataLoader

    device = torch.device("cuda")
    loader = DataLoader(data, pin_memory=True)
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        model(images, targets).backward()
    """
    assert lines(source, "ACC103") == [8]


def test_acc103_loader_of_another_module_that_may_not_pin_is_not_reported(cli, tmp_path):
    """ACC102 cannot tell whether `make_loader` pins (its keywords come in `**options`),
    so it leaves the loader alone; ACC103 must not assume it will be pinned."""
    files = {
        "data.py": """\
            from torch.utils.data import DataLoader


            def make_loader(dataset, **options):
                return DataLoader(dataset, batch_size=32, **options)
            """,
        "train.py": """\
            import torch
            from data import make_loader

            device = torch.device("cuda")
            model = torch.nn.Linear(4, 2).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in make_loader(dataset, shuffle=True):
                x, y = x.to(device), y.to(device)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
            """,
    }
    found = project(cli, tmp_path, files, "train.py", "data.py")
    assert [f for f in found if f[2] in ("ACC102", "ACC103")] == []


def test_acc103_kwargs_of_the_loader_are_read_in_its_own_module(cli, tmp_path):
    """`**kwargs` of a loader built in data.py are data.py's dict, not a dict of the same
    name in train.py."""
    files = {
        "data.py": """\
            from torch.utils.data import DataLoader

            kwargs = {"batch_size": 32}
            val_loader = DataLoader(dataset, **kwargs)
            """,
        "train.py": """\
            import torch
            from data import val_loader

            kwargs = {"pin_memory": True}
            device = torch.device("cuda")
            with torch.no_grad():
                for x, y in val_loader:
                    correct = model(x.to(device)).argmax(1).eq(y.to(device)).sum()
            """,
    }
    assert [f for f in project(cli, tmp_path, files, "train.py") if f[2] == "ACC103"] == []


# -- a step whose backward pass is in a loss-scaler helper -------------------------------
LOSS_SCALER = """\
import math
import sys

import torch


class LossScaler:
    def __init__(self):
        self.scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, update=True):
        self.scaler.scale(loss).backward()
        if update:
            self.scaler.step(optimizer)
            self.scaler.update()


model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.AdamW(model.parameters())
loss_scaler = LossScaler()
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
    loss_value = loss.item()
    if not math.isfinite(loss_value):
        print(f"loss is {loss_value}, stopping")
        sys.exit(1)
    loss_scaler(loss, optimizer)
    history.append(loss_value)
"""


def test_acc204_loop_that_calls_a_loss_scaler_helper_is_a_training_step():
    """The loss is checked and logged every step: the logging part could wait."""
    assert lines(LOSS_SCALER, "ACC204") == [23]


def test_acc204_loss_scaler_of_a_library_with_an_annotated_optimizer():
    source = """\
    import torch
    from timm.utils import NativeScaler


    def train_one_epoch(model, loader, optimizer: torch.optim.Optimizer, loss_scaler):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            loss_scaler(loss, optimizer, parameters=model.parameters())
            meter.update(loss.item())


    train_one_epoch(torch.nn.Linear(4, 2).cuda(), loader, make_optimizer(), NativeScaler())
    """
    assert lines(source, "ACC204") == [9]


def test_acc204_item_that_only_decides_to_stop_is_not_reported():
    only_stops = LOSS_SCALER.replace("    history.append(loss_value)\n", "")
    assert lines(only_stops, "ACC204") == []


def test_acc204_host_copy_that_feeds_the_environment_is_not_reported():
    """The greedy action must reach the host for `envs.step()`, whose observations go
    back into the network: nothing to accumulate or read less often."""
    source = """\
    import torch

    q_network = QNetwork().cuda()
    optimizer = torch.optim.Adam(q_network.parameters())
    obs = envs.reset()
    for step in range(total_steps):
        q_values = q_network(torch.Tensor(obs).cuda())
        actions = torch.argmax(q_values, dim=1).cpu().numpy()
        next_obs, rewards, dones, infos = envs.step(actions)
        buffer.add(obs, actions, rewards)
        obs = next_obs
        loss = q_values.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    assert lines(source, "ACC204") == []


def test_acc204_cpu_and_tolist_only_logged_every_step_are_reported():
    source = """\
    import torch

    model = Net().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        out = model(x.cuda())
        loss = criterion(out, y.cuda())
        loss.backward()
        writer.add_histogram("pred", out.argmax(1).cpu())
        print("first logits", out[0].tolist())
    """
    assert lines(source, "ACC204") == [9, 10]


def test_acc204_outputs_of_a_model_method_are_device_tensors():
    source = """\
    import torch
    from torch import nn


    class Agent(nn.Module):
        def get_action_and_value(self, x):
            return self.actor(x), self.critic(x)


    agent = Agent().cuda()
    optimizer = torch.optim.Adam(agent.parameters())
    for start in range(0, batch_size, minibatch_size):
        logits, value = agent.get_action_and_value(obs[start:start + minibatch_size])
        ratio = logits.exp()
        clipfracs += [(ratio > 1.2).float().mean().item()]
        value.mean().backward()
        optimizer.step()
    """
    assert lines(source, "ACC204") == [15]


# -- the step in engine.py, the loader and the DDP model in main.py ------------------------
UTILS = """\
class MetricLogger:
    def log_every(self, iterable, print_freq):
        for i, obj in enumerate(iterable):
            yield obj
"""

ENGINE = """\
import torch

import utils


def train_one_epoch(model, data_loader, optimizer, device, loss_scaler, accum_iter):
    metric_logger = utils.MetricLogger()
    for step, (samples, _) in enumerate(metric_logger.log_every(data_loader, 20)):
        samples = samples.to(device, non_blocking=True)
        loss = model(samples)
        loss /= accum_iter
        loss_scaler(loss, optimizer, update_grad=(step + 1) % accum_iter == 0)


def evaluate(model, data_loader, device):
    metric_logger = utils.MetricLogger()
    with torch.no_grad():
        for samples, _ in metric_logger.log_every(data_loader, 20):
            model(samples.to(device, non_blocking=True))
"""

SCALER = """\
class Scaler:
    def __call__(self, loss, optimizer, update_grad=True):
        loss.backward()
        if update_grad:
            optimizer.step()
            optimizer.zero_grad()
"""

MAIN = """\
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from engine import evaluate, train_one_epoch
from scaler import Scaler

device = torch.device("cuda")
model = DistributedDataParallel(Net().to(device), device_ids=[0])
optimizer = torch.optim.AdamW(model.parameters())
train_loader = DataLoader(train_set, batch_size=64, num_workers=4)
val_loader = DataLoader(val_set, batch_size=64, num_workers=4)
for epoch in range(10):
    train_one_epoch(model, train_loader, optimizer, device, Scaler(), 4)
    evaluate(model, val_loader, device)
"""


def test_acc102_training_loader_whose_loop_is_in_another_module(cli, tmp_path):
    """The loop reads the loader through a logger's generator (`log_every`), as it reads
    it through `tqdm`; the validation loader feeds no training step."""
    files = {"main.py": MAIN, "engine.py": ENGINE, "utils.py": UTILS, "scaler.py": SCALER}
    found = project(cli, tmp_path, files, "main.py")
    assert [f for f in found if f[2] == "ACC102"] == [("main.py", 11, "ACC102")]


def test_acc404_accumulation_in_a_helper_with_ddp_built_in_main(cli, tmp_path):
    files = {"main.py": MAIN, "engine.py": ENGINE, "utils.py": UTILS, "scaler.py": SCALER}
    found = project(cli, tmp_path, files, "engine.py")
    assert [f for f in found if f[2] == "ACC404"] == [("engine.py", 12, "ACC404")]


def test_acc404_micro_batches_in_a_helper_under_ddp():
    source = """\
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(Net().cuda(), device_ids=[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


    def forward_backward(batch):
        for micro in batch.chunk(4):
            model(micro).mean().backward()


    for batch in loader:
        forward_backward(batch.cuda())
        optimizer.step()
        optimizer.zero_grad()
    """
    assert lines(source, "ACC404") == [10]


def test_acc103_a_loader_pinned_on_the_cuda_path_through_a_conditional_dict():
    """`{"pin_memory": True} if args.cuda else {}` (pytorch/examples' older mnist): the
    loader pins where the copy goes to the GPU, so the copy is reported, in training and
    in evaluation alike."""
    source = """\
    import torch
    from torch.utils.data import DataLoader

    kwargs = {"num_workers": 1, "pin_memory": True} if args.cuda else {}
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True, **kwargs)
    test_loader = DataLoader(test_set, batch_size=64, **kwargs)
    model = Net().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for data, target in train_loader:
        data, target = data.cuda(), target.cuda()
        loss = torch.nn.functional.nll_loss(model(data), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        for data, target in test_loader:
            data = data.cuda()
            print(model(data).sum())
    """
    assert lines(source, "ACC103") == [10, 10, 17]
