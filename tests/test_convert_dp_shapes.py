"""`--to dp` on the shapes of fixtures/dp/: which steps move into `LossInForward`, which
are refused (naming the line), and that a refusal exits 1 as `--to ddp`'s do."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoaccel.convert.command import needs_facts
from autoaccel.convert.log import Change, ConversionLog, ConvertOptions, Skipped
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.convert.transforms.data_parallel import settle_project_refusals
from autoaccel.convert.transforms.data_parallel.compute_loss_in_forward import (
    _BY_HAND,
    _STEP,
    ComputeLossInForward,
)
from autoaccel.convert.transforms.data_parallel.step_segments import RUN_CAN_TELL
from autoaccel.facts.model import Forward, RunFacts, Seen, Site
from autoaccel.facts.resolve import ConversionFacts
from autoaccel.fileio import read_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
DP = ConvertOptions(target="dp", amp="off")


def converted(name: str):
    return convert_source((FIXTURES / name).read_text(encoding="utf-8"), DP, str(FIXTURES / name))


@pytest.mark.parametrize(
    ("name", "excerpts"),
    [
        pytest.param(  # ninth unseen set F9 (the GPT lecture's get_batch): was refused
            "stacked_batches.py",
            [
                "def compute_loss(model, xb, yb):",
                "    loss = loss_on_gpus(xb, yb).mean()  # mean of the per-GPU losses\n",
            ],
            id="stacked-batches",
        ),
        pytest.param(
            "two_inputs.py",
            [
                "def compute_loss(model, x_noisy, t, noise):",
                "loss = loss_on_gpus(x_noisy, t, noise).mean()",
            ],
            id="two-inputs",
        ),
        pytest.param(
            "trainer_attribute.py",
            [
                "def compute_loss(model, criterion, tokens, lengths, y):",
                "            logits = model(tokens, lengths)[0]\n            logits = logits.squeeze(1)\n",
                "loss_on_gpus = LossInForward(compute_loss, self.model, self.criterion)",
                # the timer stays outside, after the call
                "loss, logits = loss_on_gpus(tokens, lengths, y)\n",
            ],
            id="trainer-attribute",
        ),
        pytest.param(
            "gan_two_steps.py",
            [
                "def compute_g_loss(generator, discriminator, adversarial_loss, z, valid):",
                "d_loss_on_gpus = LossInForward(compute_d_loss, discriminator, adversarial_loss)",
                "g_loss, gen_imgs = g_loss_on_gpus(z, valid)",
            ],
            id="gan",
        ),
        pytest.param(
            "distill_frozen.py",
            [
                "loss_on_gpus = LossInForward(compute_loss, student)\n",
                "loss, distill = loss_on_gpus(x, soft, y)",
            ],
            id="frozen-teacher",
        ),
        pytest.param(
            "existing_dp_step.py",
            [
                "loss_on_gpus = LossInForward(compute_loss, model, criterion)",
                "torch.save(model.state_dict()",
            ],
            id="existing-data-parallel",
        ),
        pytest.param(
            "loss_function.py",
            [
                # the project's loss function, reached through the parameter `loss_fn`
                "        loss = loss_fn(output, y, teacher_output, T=4.0, alpha=0.7)\n        return loss\n",
                "loss = loss_on_gpus(x, y, teacher_output).mean()  # mean of the per-GPU losses",
            ],
            id="project-loss-function",
        ),
        pytest.param(
            "summed_vae.py",
            [
                "        kl_div = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())\n",
                "loss, kl_div, reconst_loss = loss_on_gpus(x)\n",
                "loss = loss.sum()  # sum of the per-GPU losses\n",
                "kl_div = kl_div.sum()\n",
            ],
            id="summed-loss",
        ),
        pytest.param(
            "gan_batch_size_labels.py",
            [
                # labels made with the loader's `batch_size` are split with the batch
                "def compute_d_loss(discriminator, criterion, generator, real, real_labels, z, fake_labels):",
                # `real_score = outputs` keeps the first `outputs`: it moves in with the chain
                "        real_score = outputs\n        fake_images = generator(z)\n",
                "return d_loss, fake_images, real_score\n",
                # the step under `if i % n_critic == 0:` reads the `z` drawn above it; the
                # in-place refill of its target runs before the call
                "                target.fill_(1.0)\n                g_loss, fake_images = g_loss_on_gpus(z, target)\n",
            ],
            id="batch-size-labels",
        ),
    ],
)
def test_step_moves_into_loss_in_forward(name: str, excerpts: list[str]) -> None:
    conversion = converted(name)
    code = conversion.converted
    for excerpt in excerpts:
        assert excerpt in code, excerpt
    assert not [s for s in conversion.log.skipped if s.wrong]
    compile(code, name, "exec")


def test_timer_stays_outside_the_wrapper() -> None:
    code = converted("trainer_attribute.py").converted
    function = code[code.index("def compute_loss") : code.index("return loss, logits")]
    assert "perf_counter" not in function
    assert code.index("loss_on_gpus(tokens") < code.index("elapsed = time.perf_counter() - start")


def test_frozen_teacher_gets_no_wrapper() -> None:
    code = converted("distill_frozen.py").converted
    assert "teacher" not in code[code.index("def compute_loss") : code.index("loss_on_gpus = ")]
    assert "nn.DataParallel(model)" not in code and "DataParallel(teacher" not in code


def test_existing_data_parallel_is_upgraded() -> None:
    conversion = converted("existing_dp_step.py")
    code = conversion.converted
    assert "model = nn.DataParallel(model)" not in code
    assert "loss_on_gpus = nn.DataParallel(loss_on_gpus)" in code
    # the note names the class the step writes (it said `ModelWithLoss`: ninth set's re-run)
    assert any(
        c.description.startswith("`model` stays the bare model: `LossInForward` replicates it")
        for c in conversion.log.changes
    )


@pytest.mark.parametrize(
    ("name", "line", "reason"),
    [
        pytest.param("recurrent_state.py", 28, "(a recurrent state)", id="recurrent-state"),
        pytest.param(
            "forward_attribute.py",
            29,
            "sets `self.aux` (line 17)",
            id="forward-attribute",
        ),
        pytest.param(  # ninth unseen set F8 (Conditional_Diffusion_MNIST): was written
            "device_kept_in_forward.py",
            44,
            "`Diffusion.forward` moves tensors to `self.device` (`t = torch.randint(1, STEPS + 1,"
            " (x.shape[0],)).to(self.device)`)",
            id="device-kept-in-forward",
        ),
        pytest.param(  # twelfth unseen set (SimCLR): was written, exit 0
            "contrastive_pairs.py",
            33,
            "`nt_xent` compares every sample with every other: `z @ z.t()`",
            id="contrastive-pairs",
        ),
        pytest.param(  # eleventh unseen set (brain-segmentation U-Net): was written, exit 0
            "batch_dice_loss.py",
            34,
            "a term of the loss does not average or sum over the batch",
            id="batch-dice-loss",
        ),
    ],
)
def test_refused_naming_the_line(name: str, line: int, reason: str) -> None:
    skipped = [s for s in converted(name).log.skipped if s.wrong]
    assert len(skipped) == 1 and reason in skipped[0].reason
    assert skipped[0].line == line


def test_an_object_of_a_project_class_as_the_batch_is_refused() -> None:
    """Ninth unseen set F7 (gcn-pytorch's `Data`): DataParallel hands every GPU the same
    object, nothing split; it was written. The caller's loop is refused too (its step is
    in `train()`)."""
    skipped = [s for s in converted("graph_object_batch.py").log.skipped if s.wrong]
    (refusal,) = [s for s in skipped if "`Graph`" in s.reason]
    assert refusal.line == 30
    assert refusal.reason.startswith(
        "`graph` is an object of the class `Graph`, which `nn.DataParallel` does not split"
    )


def test_a_device_property_is_each_replica_s_own() -> None:
    """`self.device` computed from the parameters (a property) moves nothing to one GPU."""
    source = (FIXTURES / "device_kept_in_forward.py").read_text(encoding="utf-8")
    source = source.replace("        self.device = device\n", "").replace(
        "    def forward(self, x):\n        t =",
        "    @property\n    def device(self):\n        return self.signal.device\n\n"
        "    def forward(self, x):\n        t =",
    )
    conversion = convert_source(source, DP, "device_property.py")
    assert [s for s in conversion.log.skipped if s.wrong] == []


NET = """\
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x):
        self.features = x
        return self.layer(x)
"""


TRAIN_NET = """\
import torch
from net import Net
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=16)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(model.features.norm())
"""


def test_a_forward_of_another_module_setting_an_attribute_is_refused_at_its_file(
    tmp_path,
) -> None:
    """Proxy-Anchor (sixth unseen set): the model's class is in another file; its line
    was looked up in the script's positions (internal error: KeyError)."""
    (tmp_path / "net.py").write_text(NET)
    script = tmp_path / "train.py"
    script.write_text(TRAIN_NET)
    project = find_project(script, read_source(script))
    assert project is not None
    result = convert_project(project, ConvertOptions(target="dp"), str(script))
    (skipped,) = [s for f in result.files for s in f.conversion.log.skipped if s.wrong]
    assert "`Net.forward` sets `self.features` (net.py:10)" in skipped.reason


AMP = ConvertOptions(target="dp")  # the default mixed precision, as `convert` does


def wrapper_calls(code: str) -> dict[str, list[str]]:
    """The arguments of each generated wrapper's call (`loss_on_gpus(x, y)`), by name."""
    return {
        node.func.id: [ast.unparse(a) for a in node.args]
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id.endswith("_on_gpus")
    }


def test_loss_of_an_earlier_forward_pass_is_no_wrapper_argument() -> None:
    """The discriminator's real-sample loss, computed before its fake-sample loss (with
    its forward pass under autocast): it was passed to `nn.DataParallel`, which cannot
    split a 0-dim tensor (a crash at the first step on any GPU). Now both move into the
    function, and every argument is a batch-first tensor."""
    code = convert_source(
        (FIXTURES / "gan_amp_real_loss.py").read_text(encoding="utf-8"), AMP, "gan.py"
    ).converted
    assert wrapper_calls(code) == {
        "loss_d_on_gpus": ["real", "ones", "noise", "zeros"],
        "loss_g_on_gpus": ["fake", "ones"],
    }
    function = code[code.index("def compute_loss_d(") : code.index("return loss_d, fake")]
    assert (
        "with torch.autocast(" in function and "loss_real = bce(scores.float(), ones)" in function
    )


def test_autocast_block_moves_into_the_function() -> None:
    """`loss = model(x, noise)` under the mixed precision rewrite's autocast: `--to dp` refused
    ("not one plain assignment"); the block now runs in the function on each GPU (where
    `nn.DataParallel` would not carry its dtype), and the call is not autocast again."""
    code = convert_source(
        (FIXTURES / "loss_in_model_amp.py").read_text(encoding="utf-8"), AMP, "model.py"
    ).converted
    function = code[code.index("def compute_loss(") : code.index("return loss")]
    assert "with torch.autocast(" in function and "loss = model(x, noise)" in function
    assert (
        "            loss = loss_on_gpus(x, noise).mean()  # mean of the per-GPU losses\n" in code
    )
    assert code.count("torch.autocast(") == 1


def test_step_under_autocast_is_reported_once() -> None:
    """`outputs = net(x); loss = criterion(outputs, y)` under the autocast of the mixed
    precision rewrite: `ModelWithLoss` was applied, and the same line then reported "not
    applied" by the general shape. Now the general shape takes it (`nn.DataParallel`'s
    threads would autocast `ModelWithLoss` to float16, not to the block's dtype)."""
    source = """import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
net = nn.Linear(4, 3).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    outputs = net(x)
    loss = criterion(outputs, y)
    loss.backward()
    optimizer.step()
"""
    conversion = convert_source(source, AMP, "step.py")
    assert [c.line for c in conversion.log.changes if c.code == "ACC402"] == [11]
    assert not [s for s in conversion.log.skipped if "--to dp" in s.what]
    assert wrapper_calls(conversion.converted) == {"loss_on_gpus": ["x", "y"]}


def test_line_of_several_statements_converts() -> None:
    """`x = ...; y = ...; w = torch.ones(x.size(0)).to(device)`: the fix made the line
    too long, black split it into three statements, and the conversion ended in an
    internal error (ParserSyntaxError); the line now stays one line."""
    conversion = convert_source(
        (FIXTURES / "semicolon_step.py").read_text(encoding="utf-8"), AMP, "step.py"
    )
    assert (
        "; weight_of_each_sample = torch.ones(x.size(0), device=device)\n" in conversion.converted
    )
    assert wrapper_calls(conversion.converted) == {
        "loss_on_gpus": ["x", "weight_of_each_sample", "y"]
    }


def test_module_without_a_training_step_does_not_veto_the_project(tmp_path: Path, capsys) -> None:
    """helper_loaders.py trains, batch_loaders.py only builds its loader: that module said
    "no training step was found" and the conversion was refused."""
    from autoaccel.convert import command

    for name in ("helper_loaders.py", "batch_loaders.py"):
        (tmp_path / name).write_bytes((FIXTURES / name).read_bytes())
    assert command.run_convert(tmp_path / "helper_loaders.py", DP, write=True) == 0
    assert (
        "model_with_loss = ModelWithLoss(model, criterion)"
        in (tmp_path / "helper_loaders.py").read_text()
    )
    assert "DataParallel" not in (tmp_path / "batch_loaders.py").read_text()
    assert "no training step" not in capsys.readouterr().err


def test_dp_that_adds_no_data_parallel_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "out.py"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoaccel",
            "convert",
            str(FIXTURES / "recurrent_state.py"),
            "--to",
            "dp",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert (
        "--to dp refused: no DataParallel was added" in proc.stderr
        and "recurrent state" in proc.stderr
    )
    assert not out.exists()


STEP = """import torch
import torch.nn as nn
import torch.nn.functional as F

{helper}
model = nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    out = model(x)
    {loss}
    loss.backward()
"""


@pytest.mark.parametrize(
    ("helper", "loss", "combined"),
    [
        pytest.param("", "loss = ((out - y) ** 2).sum()", "sum", id="sum-method"),
        pytest.param(
            "",
            "loss = F.mse_loss(out, y, reduction='sum') + 0.1 * torch.sum(out ** 2)",
            "sum",
            id="sums-added",
        ),
        pytest.param(
            "", "loss = F.mse_loss(out, y, size_average=False)", "sum", id="legacy-size-average"
        ),
        pytest.param(
            "def my_loss(a, b):\n    return F.l1_loss(a, b) + (a - b).pow(2).mean()\n",
            "loss = my_loss(out, y)",
            "mean",
            id="project-function-of-means",
        ),
        pytest.param(
            "def my_loss(a, b):\n    bce = F.mse_loss(a, b, reduction='sum')\n    return (bce + a.pow(2).sum()) / a.size(0)\n",
            "loss = my_loss(out, y)",
            "mean",
            id="sums-divided-by-the-batch-size",
        ),
    ],
)
def test_per_gpu_losses_combine_as_the_loss_reduces(helper: str, loss: str, combined: str) -> None:
    code = convert_source(STEP.format(helper=helper, loss=loss), DP, "step.py").converted
    assert f"loss = loss_on_gpus(x, y).{combined}()  # {combined} of the per-GPU losses" in code


def test_a_criterion_built_with_legacy_size_average_averages() -> None:
    """Ninth unseen set F3 (siamese-pytorch's `BCEWithLogitsLoss(size_average=True)`, the
    old spelling of a mean): refused as "does not average or sum over the batch"."""
    helper = "criterion = nn.BCEWithLogitsLoss(size_average=True)\n"
    source = STEP.format(helper=helper, loss="loss = criterion(out, y)")
    code = convert_source(source, DP, "step.py").converted
    assert "loss = model_with_loss(x, y).mean()  # mean of the per-GPU losses" in code


@pytest.mark.parametrize(
    ("helper", "loss", "reason"),
    [
        pytest.param(
            "def my_loss(a, b):\n    return (a - b).abs()\n",
            "loss = my_loss(out, y).max()",
            "not computed by a loss function autoaccel knows",
            id="project-function-not-reducing",
        ),
        pytest.param(
            "def my_loss(a, b):\n    d = (a - b).abs()\n    return d.sum() / d.numel() ** 0.5\n",
            "loss = my_loss(out, y)",
            "does not average or sum",
            id="project-function-odd-scale",
        ),
        pytest.param(
            "",
            "loss = F.mse_loss(out, y) * F.l1_loss(out, y)",
            "does not average or sum",
            id="product-of-losses",
        ),
        pytest.param(
            "",
            "loss = F.mse_loss(out, y, reduction='none').sum() + F.l1_loss(out, y)",
            "mixes summed and averaged",
            id="sum-and-mean",
        ),
    ],
)
def test_losses_that_do_not_combine_are_refused(helper: str, loss: str, reason: str) -> None:
    conversion = convert_source(STEP.format(helper=helper, loss=loss), DP, "step.py")
    assert "LossInForward(" not in conversion.converted
    assert any(reason in s.reason for s in conversion.log.skipped), [
        s.reason for s in conversion.log.skipped
    ]


def test_method_step_builds_its_wrapper_once_in_init() -> None:
    source = """import torch
import torch.nn as nn
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, device):
        self.model = model.to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, x, y):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()

    def fit(self, loader):
        for x, y in loader:
            self.step(x, y)
"""
    code = convert_source(source, DP, "trainer.py").converted
    init = code[code.index("    def __init__(self, model, device)") : code.index("    def step(")]
    assert "        self.loss_on_gpus = LossInForward(compute_loss, self.model)\n" in init
    assert code.index("\ndef compute_loss(model, x, y):") < code.index("class Trainer:")
    step = code[code.index("    def step(") : code.index("    def fit(")]
    assert "LossInForward" not in step and "DataParallel" not in step
    assert "loss = self.loss_on_gpus(x, y).mean()" in step
    assert convert_source(code, DP, "trainer.py").converted == code


# -- batch-first as a short run showed it (hand-made facts: nothing runs) ---------------------------
def converted_with_facts(path: Path, call: str, *seen: Seen):
    """The script at `path` converted with facts of a run whose calls at `call` (its
    code) saw `seen`."""
    source = path.read_text(encoding="utf-8")
    node = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call) and ast.get_source_segment(source, n) == call
    )
    real = os.path.realpath(path)
    site = Site(real, node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
    count = sum(s.count for s in seen)
    facts = RunFacts(
        script=real,
        exit="max-steps",
        steps=count,
        files={real: hashlib.sha256(source.encode()).hexdigest()},
        forwards=[Forward(1, site, count, seen[0].args, seen)],
    )
    return convert_source(source, DP, str(path), ConversionFacts(facts, path, source))


def refusals(conversion) -> list[str]:
    return [s.reason for s in conversion.log.skipped if s.wrong]


VAE_OUTPUTS = ((10, 16), (10, 4), (10, 4))


def test_flattened_input_is_refused_without_a_run_that_could_tell() -> None:
    conversion = converted("flattened_vae.py")
    [reason] = refusals(conversion)
    assert "`x` is reshaped with `-1` first" in reason and RUN_CAN_TELL in reason
    assert needs_facts(conversion, DP)  # so `convert` runs the script


def test_no_run_keeps_the_refusal(cli) -> None:
    result = cli("convert", str(FIXTURES / "flattened_vae.py"), "--to", "dp", "--no-run")
    assert result.exit_code == 1
    assert RUN_CAN_TELL in result.stderr and "running the script" not in result.stderr


def test_a_flattened_target_asks_no_run() -> None:
    # `y` never reaches a model: the run records nothing that could tell
    source = STEP.format(
        helper="criterion = nn.CrossEntropyLoss()", loss="loss = criterion(out.view(-1, 2), y)"
    ).replace("    out = model(x)\n", "    y = y.view(-1)\n    out = model(x)\n")
    conversion = convert_source(source, DP)
    assert any("may merge the batch dimension" in r for r in refusals(conversion))
    assert not needs_facts(conversion, DP)


def test_run_showing_the_flattened_input_batch_first_converts() -> None:
    conversion = converted_with_facts(
        FIXTURES / "flattened_vae.py", "model(x)", Seen(10, ((10, 16),), VAE_OUTPUTS, 5)
    )
    assert refusals(conversion) == []
    assert "loss, kl_div, reconst_loss = loss_on_gpus(x)\n" in conversion.converted
    [change] = [c for c in conversion.log.changes if c.code == "ACC402"]
    assert (
        "batch-first as a short run of the script showed: `x`: dimension 0 is the batch on all 5 calls"
        in change.description
    )


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        pytest.param((16, 16), "which dimension is the batch is ambiguous", id="ambiguous"),
        pytest.param((20, 16), "shape [20, 16] in a step of 10 samples", id="batch-merged"),
    ],
)
def test_run_that_does_not_show_the_flattened_input_batch_first_keeps_the_refusal(
    shape, why
) -> None:
    batch = 16 if shape == (16, 16) else 10
    conversion = converted_with_facts(
        FIXTURES / "flattened_vae.py", "model(x)", Seen(batch, (shape,), VAE_OUTPUTS, 5)
    )
    [reason] = refusals(conversion)
    assert (
        "`x` is reshaped with `-1` first" in reason
        and "; the run does not show it batch-first: " in reason
    )
    assert why in reason


def test_run_disagreeing_with_the_code_refuses_showing_both() -> None:
    # the code reads `x` from the batch; the run saw `model(x)` get 8 rows in steps of 16.
    # Another step pins the loader's memory: the stability check converts that result
    # again, with the run's facts mapped through the first pass, and refuses alike.
    conversion = converted_with_facts(
        FIXTURES / "summed_vae.py", "model(x)", Seen(16, ((8, 16),), VAE_OUTPUTS, 5)
    )
    assert "pin_memory" in conversion.converted
    [reason] = refusals(conversion)
    assert (
        "the code takes it as batch-first, but the run shows `model(x)` getting it with shape [8, 16] in a step of 16 samples"
        in reason
    )


KEPT_OUTPUT = """import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        h = self.fc(x)
        return h, h.relu()


model = Net().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    out, features = model(x)
    loss = F.mse_loss(out, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(features.norm())
"""


def test_run_showing_a_returned_element_batch_first_gathers_it(tmp_path: Path) -> None:
    script = tmp_path / "kept.py"
    script.write_text(KEPT_OUTPUT)
    static = convert_source(KEPT_OUTPUT, DP)
    assert any(
        "`features` comes from a model returning several values" in r for r in refusals(static)
    )
    assert needs_facts(static, DP)
    conversion = converted_with_facts(script, "model(x)", Seen(4, ((4, 4),), ((4, 2), (4, 2)), 5))
    assert refusals(conversion) == []
    assert "loss, features = loss_on_gpus(x, y)\n" in conversion.converted


def test_batches_known_to_come_from_no_dataloader_are_not_taken_as_batch_first():
    """keyed seq2seq (eighth unseen set, silently wrong on >= 2 GPUs): torchtext's
    `BucketIterator` makes `[len, batch]` tensors, and the loss-in-forward DataParallel
    split them along dimension 0, the time steps. Batches of a loader the analysis does
    not know stay taken as batch-first (`for x, y in loader:`)."""
    from autoaccel.convert.pipeline import convert_source

    step = """\
import torch
import torch.nn.functional as F
from torchtext.data import BucketIterator
from model import Seq2Seq

train_iter = BucketIterator(train, batch_size=32)
model = Seq2Seq().cuda()
optimizer = torch.optim.Adam(model.parameters())
for batch in train_iter:
    src, trg = batch.src.cuda(), batch.trg.cuda()
    output = model(src, trg)
    loss = F.nll_loss(output.view(-1, 10), trg.view(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
    refused = convert_source(step, DP).log.skipped
    assert any(
        "comes from batches no torch DataLoader makes" in s.reason for s in refused if s.wrong
    )
    unknown = step.replace("train_iter = BucketIterator(train, batch_size=32)\n", "")
    assert "loss_on_gpus" in convert_source(unknown, DP).converted


def test_a_loss_class_of_the_project_that_averages_is_split() -> None:
    """The Dice fixture's loss class made a mean over its elements: its forward's `return`
    is read (before, any loss class of the project was taken for a mean, unread)."""
    source = (FIXTURES / "batch_dice_loss.py").read_text()
    start = source.index("        y_pred = y_pred[:, 0]")
    end = source.index("        return 1.0 - dsc\n") + len("        return 1.0 - dsc\n")
    source = source[:start] + "        return ((y_pred - y_true) ** 2).mean()\n" + source[end:]
    conversion = convert_source(source, ConvertOptions(target="dp", amp="off"), "train.py")
    assert not [s for s in conversion.log.skipped if s.wrong]
    assert "nn.DataParallel(" in conversion.converted


@pytest.mark.parametrize(
    ("trained", "refused"),
    [(None, False), ({0}, True), ({1}, False), ({0, 1}, False)],
    ids=["no-run", "run-trains-only-the-refused-file", "run-trains-the-wrapped-file", "both"],
)
def test_a_wrapper_elsewhere_settles_refusals_only_where_the_run_trains(trained, refused) -> None:
    """File 0 refused its step, file 1 got a DataParallel: the refusal stands when a run
    showed that only file 0 trains (a GAN class of its own, picked by a flag)."""
    logs = [ConversionLog(), ConversionLog()]
    logs[0].skipped.append(Skipped(_STEP, 40, "`C_fake` is not batch-first" + _BY_HAND, wrong=True))
    logs[1].changes.append(Change(ComputeLossInForward.code, 25, "`D_loss` inside forward"))
    settle_project_refusals(logs, trained)
    assert logs[0].skipped[0].wrong is refused


def test_an_attribute_forward_only_sets_is_no_refusal() -> None:
    """`self.aux` set in forward and read by nothing: lost on a replica harmlessly, so the
    step converts (the fixture reads it after the call, and is refused)."""
    source = (FIXTURES / "forward_attribute.py").read_text()
    source = source.replace(" + 0.01 * model.aux", "").replace(
        "model = Sparse()", 'model = Sparse().to("cuda" if torch.cuda.is_available() else "cpu")'
    )
    conversion = convert_source(source, DP, str(FIXTURES / "forward_attribute.py"))
    assert not [s for s in conversion.log.skipped if s.wrong]
    assert "nn.DataParallel(" in conversion.converted


@pytest.mark.parametrize(
    "similarity",
    [
        "torch.mm(z, z.t())",
        "z.matmul(z.T)",
        "F.cosine_similarity(z.unsqueeze(1), z.unsqueeze(0), dim=-1)",
    ],
)
def test_other_spellings_of_a_similarity_matrix_pair_samples(similarity: str) -> None:
    source = (FIXTURES / "contrastive_pairs.py").read_text()
    source = source.replace("z @ z.t()", similarity)
    (skip,) = [s for s in convert_source(source, DP, "train.py").log.skipped if s.wrong]
    assert "compares every sample with every other" in skip.reason


def test_a_product_with_a_weight_is_no_pairing() -> None:
    """`z @ self.weight`-like products of the batch with something else stay per sample."""
    source = (FIXTURES / "contrastive_pairs.py").read_text()
    source = source.replace("z @ z.t() / temperature", "z @ PROTOTYPES").replace(
        "\n\ndef nt_xent", "\nPROTOTYPES = torch.randn(4, 32)\n\n\ndef nt_xent"
    )
    skipped = [s for s in convert_source(source, DP, "train.py").log.skipped if s.wrong]
    assert not any("compares every sample" in s.reason for s in skipped)


SQUEEZED_TARGET = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(TensorDataset(torch.randn(18, 1, 8, 8), torch.randint(0, 3, (18, 1, 8, 8))), batch_size=4)
model = nn.Conv2d(1, 3, 3, padding=1).to(device)
scale = nn.Parameter(torch.ones(1, 3, 1, 1))
optimizer = torch.optim.SGD([*model.parameters(), scale], lr=0.1)
for image, mask in loader:
    image, mask = image.to(device), mask.to(device)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(image) * scale.squeeze(), mask.squeeze())
    loss.backward()
    optimizer.step()
"""


def test_a_squeeze_of_the_batch_keeps_its_batch_dimension_on_each_gpu() -> None:
    """useg's `criterion(out, target.squeeze())`: a (B, 1, H, W) mask squeezed to (B, H, W);
    on a GPU given one sample of the batch (9 samples over 8 GPUs: parts of 2, 2, 2, 2, 1)
    `squeeze()` dropped the batch dimension too and the loss raised. What is not the
    batch's (`scale`, a parameter) is squeezed as written."""
    conversion = convert_source(SQUEEZED_TARGET, DP, "train.py")
    assert (
        "        model(image) * scale.squeeze(), mask.squeeze(tuple(range(1, mask.dim())))\n"
        in conversion.converted
    )
    assert (
        Change(
            "ACC402",
            13,
            "`mask.squeeze()` keeps the batch dimension on each GPU: a GPU's part of the batch may"
            " hold one sample (the last batch's remainder)",
        )
        in conversion.log.changes
    )


CALLED_LOSS = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class TargetLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("one", torch.tensor(1.0))
        self.mse = nn.MSELoss()

    def __call__(self, prediction, real):
        target = self.one if real else self.one * 0
        return self.mse(prediction, target.expand_as(prediction))


class Net(nn.Linear):
    def __call__(self, x):  # for type hints: nn.Module's call runs forward
        return super().__call__(x)


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(TensorDataset(torch.randn(64, 10)), batch_size=8)
model = Net(10, 4).to(device)
criterion = TargetLoss().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for (x,) in loader:
    x = x.to(device)
    optimizer.zero_grad()
    loss = criterion(model(x), True)
    loss.backward()
    optimizer.step()
"""


def test_a_loss_class_that_computes_in_its_own_call_is_read_there() -> None:
    """pix2pix's GANLoss defines `__call__`, not `forward`: its mean over the batch was not
    read and dp refused ("a term of the loss does not average or sum over the batch"). A
    `__call__` that hands over to `nn.Module.__call__` still runs `forward`."""
    conversion = convert_source(CALLED_LOSS, DP, "train.py")
    assert not [s for s in conversion.log.skipped if s.wrong]
    assert "model_with_loss = ModelWithLoss(model, criterion)" in conversion.converted


def test_a_kl_divergence_averaged_over_the_batch_is_a_mean() -> None:
    """A distillation step's `nn.KLDivLoss(reduction="batchmean")`: the sum over the batch
    divided by its size, a mean over the samples (it was taken for no reduction and dp
    refused). The teacher's outputs, under `no_grad()` after the student's forward, are
    passed in as a batch-first input."""
    source = CALLED_LOSS.replace(
        "criterion = TargetLoss().to(device)\n",
        'criterion = nn.KLDivLoss(reduction="batchmean")\nteacher = nn.Linear(10, 4).to(device)\n',
    ).replace(
        "    loss = criterion(model(x), True)\n",
        "    out = model(x)\n"
        "    with torch.no_grad():\n"
        "        t_out = teacher(x)\n"
        "    loss = criterion(out.log_softmax(1), t_out.softmax(1))\n",
    )
    conversion = convert_source(source, DP, "train.py")
    assert not [s for s in conversion.log.skipped if s.wrong]
    assert (
        "loss = loss_on_gpus(x, t_out).mean()  # mean of the per-GPU losses" in conversion.converted
    )
