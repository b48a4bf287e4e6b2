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
    cpu_only = ACCELERATOR_OR_CPU.replace(
        "torch.accelerator.current_accelerator()", 'torch.device("cpu")'
    )
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


# -- hold-out round: legacy tensor types, per-step functions, batch-sized GEMMs ------------
def test_acc103_batch_copied_with_a_legacy_cuda_tensor_type():
    """`imgs.type(Tensor)` with `Tensor = torch.cuda.FloatTensor if cuda else ...` is the
    same blocking copy as `.cuda()`; `Tensor.type` takes `non_blocking`."""
    source = """\
    import torch
    from torch.utils.data import DataLoader

    cuda = torch.cuda.is_available()
    Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
    loader = DataLoader(data, batch_size=64)
    for imgs, _ in loader:
        real = imgs.type(Tensor)
        cpu = imgs.type(torch.FloatTensor)
        model(real).sum().backward()
    """
    assert lines(source, "ACC103") == [8]


FULL_BATCH = """\
import torch
import torch.nn.functional as F


def accuracy(output, labels):
    correct = output.max(1)[1].eq(labels).double()
    correct = correct.sum()
    return correct / len(labels)


model = Net().cuda()
optimizer = torch.optim.Adam(model.parameters())


def train(epoch):
    optimizer.zero_grad()
    output = model(features)
    loss_train = F.nll_loss(output, labels)
    acc_train = accuracy(output, labels)
    loss_train.backward()
    optimizer.step()
    print(epoch, loss_train.item(), acc_train.item())


for epoch in range(200):
    {call}
"""


def test_acc204_function_that_is_the_step_called_every_epoch():
    """`train(epoch)` does one full-batch step: each call is a step, so its `.item()`s
    (of the loss, and of what a helper computes from device tensors) run every step."""
    assert lines(FULL_BATCH.format(call="train(epoch)"), "ACC204") == [22, 22]


def test_acc204_function_called_under_a_logging_interval_is_not_reported():
    source = FULL_BATCH.format(call="if epoch % 10 == 0:\n        train(epoch)")
    assert lines(source, "ACC204") == []


def test_acc204_helper_the_step_loop_calls_with_its_outputs():
    source = """\
    import torch


    def cal_performance(pred, gold):
        loss = torch.nn.functional.cross_entropy(pred, gold)
        n_correct = pred.max(1)[1].eq(gold).sum().item()
        return loss, n_correct


    model = Net().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for src, gold in batches:
        pred = model(src)
        loss, n_correct = cal_performance(pred, gold)
        loss.backward()
    """
    assert lines(source, "ACC204") == [6]


def test_acc204_terms_of_a_backpropagated_sum_are_device_tensors():
    """`(value_loss * coef + action_loss).backward()`: both losses carry the graph."""
    source = """\
    import torch

    model = Net().cuda()
    for sample in generator:
        value_loss = 0.5 * (model(sample) - 1).pow(2).mean()
        action_loss = -model(sample).mean()
        (value_loss * coef + action_loss).backward()
        value_loss_epoch += value_loss.item()
        action_loss_epoch += action_loss.item()
    """
    assert lines(source, "ACC204") == [8, 9]


def test_acc204_update_every_n_steps_is_not_a_logging_interval():
    source = """\
    import torch

    model = Net().cuda()
    for i, x in enumerate(loader):
        model(x).mean().backward()
        if i % n_critic == 0:
            g_loss = -model(x).mean()
            g_loss.backward()
            print(g_loss.item())
    """
    assert lines(source, "ACC204") == [9]


def test_acc204_module_imported_through_its_package_is_analysed_with_its_entry(cli, tmp_path):
    """`main.py` imports `pkg.algo`, whose `__init__.py` imports `.ppo`: ppo.py is linted
    as a module of main.py's program (which says the device is CUDA)."""
    (tmp_path / "pkg" / "algo").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    files = {
        "pkg/algo/__init__.py": "from .ppo import PPO\n",
        "pkg/algo/ppo.py": """\
        import torch


        class PPO:
            def __init__(self, net):
                self.net = net
                self.optimizer = torch.optim.Adam(net.parameters())

            def update(self, generator):
                for sample in generator:
                    loss = self.net(sample).mean()
                    loss.backward()
                    self.optimizer.step()
                    total += loss.item()
        """,
        "main.py": """\
        import torch
        from pkg import algo

        agent = algo.PPO(Net().to(torch.device("cuda")))
        for j in range(10):
            agent.update(rollouts)
        """,
    }
    found = project(cli, tmp_path, files, "pkg/algo/ppo.py")
    assert ("pkg/algo/ppo.py", 14, "ACC204") in found


def test_acc206_random_weights_moved_after_a_view_in_a_per_step_method():
    source = """\
    import torch


    def grad_pen(expert, policy):
        alpha = torch.rand(expert.size(0), 1)
        alpha = alpha.expand_as(expert).to(expert.device)
        return alpha * expert + (1 - alpha) * policy


    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        (model(x).mean() + grad_pen(x, y)).backward()
    """
    assert lines(source, "ACC206") == [5]


MLP_GAN = """\
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default={batch})
opt = parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))


model = Net().cuda()
optimizer = torch.optim.Adam(model.parameters())
loader = DataLoader(data, batch_size=opt.batch_size)
for x in loader:
    model(x.cuda()).mean().backward()
"""


def test_acc301_linear_layers_at_a_small_batch_stay_memory_bound():
    """M = 64: 64*1024*1024 / (64*1024 + 1024*1024 + 64*1024) = 57 ops/byte < 139."""
    assert lines(MLP_GAN.format(batch=64), "ACC301") == []


def test_acc301_linear_layers_at_a_large_batch_are_reported():
    """M = 512: 512*1024*1024 / (512*1024 + 1024*1024 + 512*1024) = 256 ops/byte."""
    assert lines(MLP_GAN.format(batch=512), "ACC301") == [22]


def test_acc301_weight_matrix_width_from_an_option_default():
    """A layer of the project's own (`Parameter(torch.FloatTensor(k, n))` and `torch.mm`)
    of width `args.hidden` = 16: no GEMM reaches the Tensor Cores."""
    source = """\
    import argparse

    import torch
    from torch.nn import Module, Parameter

    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=16)
    args = parser.parse_args()


    class GraphConvolution(Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.weight = Parameter(torch.FloatTensor(in_features, out_features))

        def forward(self, x, adj):
            return torch.spmm(adj, torch.mm(x, self.weight))


    class GCN(Module):
        def __init__(self, nfeat, nhid):
            super().__init__()
            self.gc1 = GraphConvolution(nfeat, nhid)


    model = GCN(nfeat=features.shape[1], nhid=args.hidden).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(200):
        model(features, adj).sum().backward()
    """
    assert lines(source, "ACC301") == []
    assert lines(source.replace("default=16", "default=4096"), "ACC301") != []


GRAD_NORM_HELPER = """\
import torch
from torch import nn

device = torch.device("cuda")
model = nn.Linear(1024, 1024).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


class Trainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def log_grad_norm(self):
        sqsum = 0.0
        for p in self.model.parameters():
            sqsum += (p.grad ** 2).sum().item()
        print(sqsum ** 0.5)

    def step(self, x, i):
        loss = self.model(x).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.log_grad_norm()
        self.optimizer.step()


trainer = Trainer(model, optimizer)
for i, x in enumerate(loader):
    trainer.step(x.to(device), i)
"""


def test_acc204_item_of_every_parameters_gradient_in_a_helper_method():
    """improved-diffusion's `_log_grad_norm`: a sync per parameter, every step."""
    assert lines(GRAD_NORM_HELPER, "ACC204") == [17]
    named = GRAD_NORM_HELPER.replace(
        "for p in self.model.parameters()", "for name, p in self.model.named_parameters()"
    )
    assert lines(named, "ACC204") == [17]


def test_acc204_the_gradient_norm_logged_every_100_steps_is_not_reported():
    gated = GRAD_NORM_HELPER.replace(
        "        self.log_grad_norm()", "        if i % 100 == 0:\n            self.log_grad_norm()"
    )
    assert lines(gated, "ACC204") == []


HF_STYLE_METHOD = """\
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(data, batch_size=64, pin_memory=True)


class Trainer:
    def train_epoch(self):
        total_loss = 0.0
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
        return total_loss


Trainer().train_epoch()
"""


def test_a_loss_read_from_the_models_output_summed_with_item_in_a_method():
    """`total_loss += loss.item()` in a method, the loss an attribute of the output and
    the batch a dict moved in a comprehension: both the sync and the copies are reported."""
    assert lines(HF_STYLE_METHOD, "ACC204") == [20]
    assert lines(HF_STYLE_METHOD, "ACC103") == [14]
