"""`--to dp`: the loss is computed inside `forward` on every GPU (ComputeLossInForward) and a
script's own `nn.DataParallel` around that model is removed (UnwrapDataParallel).

Unit tests run both steps on small sources; run tests convert every fixture with
`--to dp --amp off` and compare its losses with the original's on CPU, where
`nn.DataParallel` is not used (`next(model.parameters()).is_cuda` is false) and
`ModelWithLoss` computes exactly the original's forward pass and loss.
"""

from __future__ import annotations

from concurrent.futures import Future
from textwrap import dedent

import libcst as cst
import pytest

from autoaccel.convert.log import ConversionLog, ConvertOptions
from autoaccel.convert.transform import new_context
from autoaccel.convert.transforms.data_parallel import DP_STEPS
from running import FIXTURES_DIR, HarnessRun, SessionRuns, runs_fixture, selected
from test_convert_runs import CASES, EXACT_REL, LEGACY, final_loss, rel_gap

OPTIONS = ConvertOptions(target="dp", amp="off")


def run(source: str) -> tuple[str, ConversionLog]:
    log = ConversionLog()
    tree = cst.parse_module(dedent(source))
    for step in DP_STEPS:
        tree = step(new_context(OPTIONS, log)).transform_module(tree)
    return tree.code, log


def check(before: str, after: str) -> ConversionLog:
    code, log = run(before)
    assert code == dedent(after)
    again, second = run(code)
    assert again == code, "not idempotent"
    assert not second.changes and not second.skipped
    return log


def check_unchanged(source: str, reason: str) -> None:
    code, log = run(source)
    assert code == dedent(source)
    assert not log.changes
    assert [reason in s.reason for s in log.skipped] == [True], log.skipped


WRAPPER = '''\


class ModelWithLoss({nn}.Module):
    """A model and its loss in one `forward`: under `nn.DataParallel` each GPU
    computes the loss of its part of the batch and only the losses (one per GPU)
    are gathered, instead of every output on GPU 0."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs, targets):
        outputs = self.model(inputs)
        loss = self.loss_fn(outputs, targets)
        return {returned}

'''


def wrapper(nn: str = "nn", returned: str = "loss.unsqueeze(0)") -> str:
    return WRAPPER.format(nn=nn, returned=returned)


IMPORTS = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
"""

TOPLEVEL = IMPORTS + """
model = nn.Linear(4, 2).cuda()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# training
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        # forward
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
torch.save(model.state_dict(), "model.pt")
"""


def test_toplevel_loss_moves_into_forward() -> None:
    log = check(
        TOPLEVEL,
        IMPORTS + wrapper() + """
model = nn.Linear(4, 2).cuda()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# training
model_with_loss = ModelWithLoss(model, criterion)
if next(model.parameters()).is_cuda:  # one replica per visible GPU
    model_with_loss = nn.DataParallel(model_with_loss)
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        # forward
        loss = model_with_loss(x, y).mean()  # mean of the per-GPU losses
        loss.backward()
        optimizer.step()
torch.save(model.state_dict(), "model.pt")
""",
    )
    assert [(c.code, c.line) for c in log.changes] == [("ACC402", 14)]
    assert "`model` stays the bare model" in log.changes[0].description


def test_function_with_model_and_functional_loss_as_arguments() -> None:
    check(
        IMPORTS + """

def train(model, loader, optimizer):
    model.train()
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()


net = nn.Linear(4, 2).cuda()
train(net, loader, torch.optim.SGD(net.parameters(), lr=0.1))
""",
        IMPORTS + wrapper() + """
def train(model, loader, optimizer):
    model.train()
    model_with_loss = ModelWithLoss(model, F.nll_loss)
    if next(model.parameters()).is_cuda:  # one replica per visible GPU
        model_with_loss = nn.DataParallel(model_with_loss)
    for data, target in loader:
        optimizer.zero_grad()
        loss = model_with_loss(data, target).mean()  # mean of the per-GPU losses
        loss.backward()
        optimizer.step()


net = nn.Linear(4, 2).cuda()
train(net, loader, torch.optim.SGD(net.parameters(), lr=0.1))
""",
    )


def test_class_attributes_and_outputs_read_later() -> None:
    check(
        IMPORTS + """

class Trainer:
    def __init__(self, net):
        self.net = net.cuda()
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.Adam(self.net.parameters())

    def train_epoch(self, loader):
        correct = 0
        for x, y in loader:
            self.optimizer.zero_grad()
            logits = self.net(x)
            loss = self.criterion(logits, y)  # per-step loss
            loss.backward()
            self.optimizer.step()
            correct += (logits.argmax(1) == y).sum()
        return correct
""",
        IMPORTS + wrapper(returned="loss.unsqueeze(0), outputs") + """
class Trainer:
    def __init__(self, net):
        self.net = net.cuda()
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.Adam(self.net.parameters())

    def train_epoch(self, loader):
        correct = 0
        net_with_loss = ModelWithLoss(self.net, self.criterion)
        if next(self.net.parameters()).is_cuda:  # one replica per visible GPU
            net_with_loss = nn.DataParallel(net_with_loss)
        for x, y in loader:
            self.optimizer.zero_grad()
            loss, logits = net_with_loss(x, y)  # per-step loss
            loss = loss.mean()  # mean of the per-GPU losses
            loss.backward()
            self.optimizer.step()
            correct += (logits.argmax(1) == y).sum()
        return correct
""",
    )


def test_loss_of_the_model_call_inline_and_summed_losses() -> None:
    check(
        """\
import torch
criterion = torch.nn.MSELoss(reduction="sum")
model = torch.nn.Linear(4, 1).cuda()
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
""",
        "import torch\n" + wrapper(nn="torch.nn") + """
criterion = torch.nn.MSELoss(reduction="sum")
model = torch.nn.Linear(4, 1).cuda()
model_with_loss = ModelWithLoss(model, criterion)
if next(model.parameters()).is_cuda:  # one replica per visible GPU
    model_with_loss = torch.nn.DataParallel(model_with_loss)
for x, y in loader:
    loss = model_with_loss(x, y).sum()  # sum of the per-GPU losses
    loss.backward()
""",
    )


EXISTING = IMPORTS + """
model = Net()
if torch.cuda.device_count() > 1:
    model = nn.DataParallel(model)
model.to(device)
criterion = nn.CrossEntropyLoss()
for x, y in loader:
    out = model(x)
    loss = criterion(out, y)
    loss.backward()
if isinstance(model, nn.DataParallel):
    # unwrap before saving
    state = model.module.state_dict()
else:
    state = model.state_dict()
model.module.predict(x)
"""


def test_existing_data_parallel_is_rewritten_around_the_loss() -> None:
    log = check(
        EXISTING,
        IMPORTS + wrapper() + """
model = Net()
model.to(device)
criterion = nn.CrossEntropyLoss()
model_with_loss = ModelWithLoss(model, criterion)
if next(model.parameters()).is_cuda:  # one replica per visible GPU
    model_with_loss = nn.DataParallel(model_with_loss)
for x, y in loader:
    loss = model_with_loss(x, y).mean()  # mean of the per-GPU losses
    loss.backward()
state = model.state_dict()
model.predict(x)
""",
    )
    # lines of the text each step received; the pipeline maps them onto the original
    assert [c.code for c in log.changes] == ["ACC402"] * 5


def test_existing_data_parallel_wrapped_once_with_device_moves() -> None:
    source = IMPORTS + """
net = nn.DataParallel(Net()).cuda()
for x, y in loader:
    loss = F.cross_entropy(net(x), y)
    loss.backward()
"""
    code, _ = run(source)
    assert "net = Net().cuda()\n" in code
    assert "net_with_loss = ModelWithLoss(net, F.cross_entropy)\n" in code


def test_does_nothing_when_data_parallel_has_its_own_settings() -> None:
    check_unchanged(
        IMPORTS + """
model = nn.DataParallel(Net(), device_ids=[0, 1])
for x, y in loader:
    loss = F.cross_entropy(model(x), y)
    loss.backward()
""",
        "with its own settings",
    )


def test_does_nothing_in_a_script_that_also_trains_with_ddp() -> None:
    """pytorch/examples' imagenet picks DDP, one GPU or DataParallel from its flags;
    `--to dp` turned its DataParallel branch into one that wrapped the DDP model too."""
    check_unchanged(
        IMPORTS + """
from torch.nn.parallel import DistributedDataParallel

model = Net().cuda()
if distributed:
    model = DistributedDataParallel(model)
else:
    model = nn.DataParallel(model)
for x, y in loader:
    loss = F.cross_entropy(model(x), y)
    loss.backward()
""",
        "already trains with DistributedDataParallel",
    )


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        pytest.param(
            "out, hidden = model(x, hidden)\n    loss = criterion(out, y)",
            "(a recurrent state)",
            id="recurrent-state",
        ),
        pytest.param(
            "loss = compute_loss(batch)",
            "`compute_loss(...)` computes `loss`, but the code does not show it to be a model",
            id="loss-in-helper",
        ),
        pytest.param(
            "if flag:\n        out = model(x)\n    elif other:\n        out = model(2 * x)\n    loss = criterion(out, y)",
            "the forward pass is in an `if` block",
            id="forward-in-a-branch-without-else",
        ),
        pytest.param(
            "if x.sum() > 0:\n        out = model(x)\n    else:\n        out = model(2 * x)\n    loss = criterion(out, y)",
            "the `if` around the forward pass tests `x`, a tensor of the step",
            id="forward-in-a-branch-testing-the-batch",
        ),
        pytest.param(
            "out = model(x)\n    out = out - out.mean(0)\n    loss = criterion(out, y)",
            "mixes the samples of the batch",
            id="batch-statistics",
        ),
        pytest.param(
            "y = y.view(-1)\n    out = model(x)\n    loss = criterion(out.view(-1, 2), y)",
            "may merge the batch dimension with another",
            id="targets-flattened",
        ),
        pytest.param(
            "mask = torch.ones(4, 4)\n    out = model(x, mask)\n    loss = criterion(out, y)",
            "not known to be batch-first",
            id="tensor-not-from-the-batch",
        ),
        pytest.param(
            "out = model(x)\n    first = criterion(out, y)\n    y.clamp_(0, 1)\n    loss = first + criterion(model(x), y)",
            "is changed in place between two lines of the forward pass",
            id="input-changed-in-place-between-readers",
        ),
        pytest.param(
            "with torch.no_grad():\n        ref = model(x)\n    base = criterion(ref, y)\n"
            "    loss = base + criterion(model(x), y)",
            "`base` is one value for the whole batch (a loss or a reduction)",
            id="loss-of-an-earlier-line-is-no-input",
        ),
        pytest.param(
            "n = x.size(0)\n    loss = F.mse_loss(model(x), y, reduction='sum') / n",
            "`n` is the size of the whole batch",
            id="batch-size-is-no-input",
        ),
        pytest.param(
            "centre = x.mean(0)\n    out = model(x)\n    loss = criterion(out - centre, y)",
            "`centre` is computed across the samples of the batch",
            id="batch-statistic-is-no-input",
        ),
    ],
)
def test_leaves_step_alone_with_a_reason(step: str, reason: str) -> None:
    """Refused, naming the line: `--to dp` would add no DataParallel, so the reason is a
    refusal (`wrong`: the CLI exits 1)."""
    source = IMPORTS + f"""
model = nn.Linear(4, 2).cuda()
criterion = nn.BCELoss()
for x, y in loader:
    {step}
    loss.backward()
"""
    check_unchanged(source, reason)
    _, log = run(source)
    assert all(s.wrong for s in log.skipped)
    assert log.skipped[0].line is not None


@pytest.mark.parametrize(
    ("size", "converts"),
    [
        pytest.param("32", True, id="the-loaders-constant"),
        pytest.param("batch_size", True, id="the-loaders-name"),
        pytest.param("64", False, id="another-constant"),
    ],
)
def test_tensor_made_with_the_loaders_batch_size_is_batch_first(size: str, converts: bool) -> None:
    """`torch.randn(batch_size, 2)` with the loader's `batch_size=` is split with the batch."""
    source = IMPORTS + f"""from torch.utils.data import DataLoader, TensorDataset
batch_size = 32
loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size={'32' if size != 'batch_size' else 'batch_size'})
model = nn.Bilinear(4, 2, 1).cuda()
criterion = nn.MSELoss()
for (x,) in loader:
    z = torch.randn({size}, 2)
    out = model(x, z)
    loss = criterion(out, x[:, :1])
    loss.backward()
"""
    code, log = run(source)
    if converts:
        assert "loss = loss_on_gpus(x, z).mean()" in code and not log.skipped
    else:
        assert "`z` is made in the step but not from the batch" in log.skipped[0].reason


@pytest.mark.parametrize("size", ["x.size(0)", "x.shape[0]", "len(x)"])
def test_tensor_made_with_the_batchs_own_size_is_batch_first(size: str) -> None:
    """`n = x.size(0)`, then `z = torch.randn(n, 2)`: `z` is split with the batch, and
    `n` itself (the whole batch's size) is no input of the wrapper."""
    source = IMPORTS + f"""
model = nn.Bilinear(4, 2, 1).cuda()
criterion = nn.MSELoss()
for x, y in loader:
    n = {size}; z = torch.randn(n, 2)
    loss = criterion(model(x, z), y)
    loss.backward()
"""
    code, log = run(source)
    assert "loss = loss_on_gpus(x, z, y).mean()" in code and not log.skipped


def test_full_batch_step_is_refused_once_naming_its_forward_pass() -> None:
    """A graph network trained on the whole graph each epoch (in `train(epoch)`): nothing
    to split. It was refused with two false reasons, one on the loop calling `train`."""
    source = IMPORTS + """
features = torch.randn(30, 4)
labels = torch.randint(0, 2, (30,))
model = nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train(epoch):
    optimizer.zero_grad()
    output = model(features)
    loss = F.cross_entropy(output, labels)
    loss.backward()
    optimizer.step()


for epoch in range(5):
    train(epoch)
"""
    check_unchanged(
        source, "the forward pass reads no tensor of the step's batch (the same tensors every step"
    )
    assert run(source)[1].skipped[0].line == 13


def test_input_made_over_two_lines_stays_before_the_call() -> None:
    """`z = torch.randn(n, 2)` then `z = z * 0.5`, between two forward passes:
    the first line was taken for one to run after the call (and `z` refused as not from
    the batch); both run before it, in order."""
    code, log = run(IMPORTS + """
model = nn.Bilinear(4, 2, 1).cuda()
criterion = nn.MSELoss()
for x, y in loader:
    n = x.size(0)
    first = model(x, x[:, :2])
    z = torch.randn(n, 2)
    z = z * 0.5
    loss = criterion(first + model(x, z), y)
    loss.backward()
""")
    assert (
        "    z = torch.randn(n, 2)\n    z = z * 0.5\n    loss = loss_on_gpus(x, z, y).mean()"
        in code
    )
    assert not log.skipped


@pytest.mark.parametrize(
    ("step", "inside"),
    [
        pytest.param(
            "real = netD(x)\n    fake = netD(netG(x))\n    loss = criterion(real, y) + criterion(fake, y)",
            "def compute_loss(netD, netG, criterion, x, y):",
            id="two-models-one-loss",
        ),
        pytest.param(
            "out, aux = model(x)\n    loss = criterion(out, y)",
            "    out, aux = model(x)\n",
            id="several-outputs",
        ),
        pytest.param(
            "loss = model(x, y)", "def compute_loss(model, x, y):", id="model-returns-loss"
        ),
        pytest.param(
            "out = model(x)\n    loss = F.cross_entropy(out, y, label_smoothing=0.1)",
            "    loss = F.cross_entropy(out, y, label_smoothing=0.1)\n",
            id="loss-keywords",
        ),
        pytest.param(
            "out = model(x)[0]\n    out = out.squeeze(1)\n    loss = criterion(out, y)",
            "    out = model(x)[0]\n    out = out.squeeze(1)\n",
            id="indexing-and-squeeze",
        ),
        pytest.param(
            "out = model(x, lengths)\n    loss = criterion(out, y)",
            "def compute_loss(model, criterion, x, lengths, y):",
            id="several-batch-first-inputs",
        ),
    ],
)
def test_general_steps_move_into_loss_in_forward(step: str, inside: str) -> None:
    source = IMPORTS + f"""
model = nn.Linear(4, 2).cuda()
netD = nn.Linear(2, 1)
netG = nn.Linear(2, 2)
criterion = nn.BCELoss()
for x, lengths, y in loader:
    {step}
    loss.backward()
"""
    code, log = run(source)
    assert inside in code
    assert "loss = loss_on_gpus(" in code and "class LossInForward(nn.Module):" in code
    assert [c.code for c in log.changes] == ["ACC402"] and not log.skipped
    again, second = run(code)
    assert again == code and not second.changes and not second.skipped


def test_unreduced_criterion_is_left_alone() -> None:
    check_unchanged(
        IMPORTS + """
model = nn.Linear(4, 2).cuda()
criterion = nn.CrossEntropyLoss(reduction="none")
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
""",
        "does not average or sum",
    )


def test_evaluation_loops_keep_the_bare_model() -> None:
    source = IMPORTS + """
model = Net()
criterion = nn.CrossEntropyLoss()
with torch.no_grad():
    for x, y in val_loader:
        out = model(x)
        total += criterion(out, y).item()
"""
    code, log = run(source)
    assert code == dedent(source)
    assert not log.changes
    # --to dp adds no DataParallel here: refused, so the command exits 1
    assert [(s.reason.startswith("no training step"), s.wrong) for s in log.skipped] == [
        (True, True)
    ]


# -- proof by running ------------------------------------------------------------------
# Every fixture converted with `--to dp --amp off` trains like the original on CPU. Epoch 1 must
# match to float rounding; for the fixtures whose RNG runs out of step from epoch 2 (the
# persistent_workers effect explained in test_convert_runs.py) only the last epoch's mean loss
# is compared, with the tolerances measured there.
DP_CHANGES = {  # fixtures whose training step the dp target rewrites; lstm_lm.py (a
    # recurrent state as a second input) is refused with a reason
    "gan.py",
    "transformer_lm.py",
    "trainer_methods.py",
    "step_functions.py",
    "cnn_toplevel.py",
    "dataparallel_existing.py",
    "imbalanced_resume.py",
    "linear_exact.py",
    "mnist_main.py",
    "resnet_cifar.py",
    "trainer_class.py",
    "transformer_accum.py",
    LEGACY,
}


def _dp_job(shared: SessionRuns, name: str) -> tuple[str, dict[str, HarnessRun]]:
    converted = shared.convert(name, "--to", "dp", "--amp", "off")
    reference = shared.convert(name, "--amp", "off") if name == LEGACY else FIXTURES_DIR / name
    args = CASES[name].args if name in CASES else ()
    runs = {"reference": shared.run(reference, args), "dp": shared.run(converted, args)}
    return converted.read_text(encoding="utf-8"), runs


def _written(run: HarnessRun) -> list[str]:
    """The files a run left in its folder (the harness's record left out)."""
    return sorted(p.name for p in run.cwd.iterdir() if not p.name.startswith("losses-"))


def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
    """Each selected fixture's runs, in the background (see running.py)."""
    return {name: shared.start(_dp_job, name) for name in selected(tests)}


DP_RUNS = sorted(set(CASES) - {"lstm_lm.py"}) + [LEGACY]  # lstm_lm.py: refused (exit 1)


dp_runs = runs_fixture(start_runs)


@pytest.mark.runs
@pytest.mark.parametrize("name", DP_RUNS)
def test_dp_conversion_trains_like_the_original(name, dp_runs) -> None:
    pytest.importorskip("torch")
    code, runs = dp_runs[name].result()
    assert ("ModelWithLoss(" in code or "LossInForward(" in code) == (name in DP_CHANGES)
    reference, dp = runs["reference"].losses, runs["dp"].losses
    # the same checkpoints, saved from the bare model
    assert _written(runs["dp"]) == _written(runs["reference"])
    assert len(dp) == len(reference) > 0
    case = CASES.get(name)
    exact = case.steps_per_epoch if case is not None and case.rng_shifts else len(reference)
    for step, (a, b) in enumerate(zip(reference[:exact], dp[:exact])):
        assert b == pytest.approx(a, rel=EXACT_REL), f"step {step}: original {a}, dp {b}"
    if case is not None and case.rng_shifts:
        gap = rel_gap(final_loss(reference, case), final_loss(dp, case))
        assert (
            gap <= case.off_tol
        ), f"final loss differs by {gap:.2%} (tolerance {case.off_tol:.0%})"


@pytest.mark.runs
@pytest.mark.parametrize("name", ["linear_exact.py"])
def test_dp_conversion_ends_with_the_original_parameters(name, dp_runs) -> None:
    """The exact-equivalence fixture (no shuffle, dropout or BatchNorm) saves its final
    `state_dict` with `--save-params`: the dp conversion's equals the original's."""
    torch = pytest.importorskip("torch")
    _, runs = dp_runs[name].result()
    saved = {variant: torch.load(run.check().cwd / "params.pt") for variant, run in runs.items()}
    assert saved["dp"].keys() == saved["reference"].keys()
    for key, value in saved["reference"].items():
        assert torch.allclose(saved["dp"][key], value, rtol=EXACT_REL, atol=0), key
