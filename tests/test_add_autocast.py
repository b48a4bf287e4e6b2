"""AddAutocast (ACC301): forward pass and loss under torch.autocast; fp16 GradScaler."""

from __future__ import annotations

from textwrap import dedent

import libcst as cst
import pytest

from autoaccel.convert.log import ConversionLog, ConvertOptions
from autoaccel.convert.transform import new_context
from autoaccel.convert.transforms.add_autocast import AddAutocast


def run(source: str, amp: str = "bf16") -> tuple[str, ConversionLog]:
    log = ConversionLog()
    tree = cst.parse_module(dedent(source))
    out = AddAutocast(new_context(ConvertOptions(amp=amp), log)).transform_module(tree)  # type: ignore[arg-type]
    return out.code, log


def check(before: str, after: str, amp: str = "bf16") -> ConversionLog:
    code, log = run(before, amp)
    assert code == dedent(after)
    again, _ = run(code, amp)
    assert again == code, "not idempotent"
    return log


HEAD = """\
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(4, 2).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""

TOPLEVEL = HEAD + """\
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
"""


def test_toplevel_bf16() -> None:
    log = check(
        TOPLEVEL,
        HEAD
        + """\
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = model(x)
            loss = criterion(out, y)
        loss.backward()
        optimizer.step()
""",
    )
    assert [c.code for c in log.changes] == ["ACC301"]


def test_toplevel_fp16_scaler_before_epoch_loop() -> None:
    check(
        TOPLEVEL,
        HEAD
        + """\
scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            out = model(x)
            loss = criterion(out, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
""",
        amp="fp16",
    )


def test_function_without_device_variable_uses_fallback() -> None:
    log = check(
        """\
        import torch


        def train(model, loader, optimizer, criterion):
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()


        model = torch.nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """,
        """\
        import torch


        def train(model, loader, optimizer, criterion):
            scaler = torch.amp.GradScaler("cuda" if torch.cuda.is_available() else "cpu", enabled=torch.cuda.is_available())
            for x, y in loader:
                optimizer.zero_grad()
                with torch.autocast(device_type="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.float16, enabled=torch.cuda.is_available()):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()


        model = torch.nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """,
        amp="fp16",
    )
    assert any("restarts at every call" in s.reason for s in log.skipped)


CLASS = """\
import torch


class Trainer:
    def __init__(self, model, loader):
        self.device = torch.device("cuda")
        self.model = model.to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters())
        self.loader = loader

    def train_epoch(self):
        for inputs, targets in self.loader:
            self.optimizer.zero_grad()
            loss = self.compute_loss(inputs, targets)
            loss.backward()
            self.optimizer.step()

    def compute_loss(self, inputs, targets):
        return torch.nn.functional.cross_entropy(self.model(inputs), targets)
"""


def test_class_method_fp16_scaler_in_init() -> None:
    expected = CLASS.replace(
        "        self.optimizer = torch.optim.Adam(self.model.parameters())\n",
        "        self.optimizer = torch.optim.Adam(self.model.parameters())\n"
        "        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.device.type == \"cuda\")\n",
    ).replace(
        """\
            loss = self.compute_loss(inputs, targets)
            loss.backward()
            self.optimizer.step()
""",
        """\
            with torch.autocast(device_type=self.device.type, dtype=torch.float16, enabled=self.device.type == "cuda"):
                loss = self.compute_loss(inputs, targets)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
""",
    )
    check(CLASS, expected, amp="fp16")


GAN = """\
import torch
import torch.nn as nn

netD = nn.Sequential(nn.Linear(2, 1), nn.Sigmoid())
netG = nn.Linear(4, 2).cuda()
criterion = nn.BCELoss()
optD = torch.optim.Adam(netD.parameters())
optG = torch.optim.Adam(netG.parameters())
for epoch in range(2):
    for real in loader:
        netD.zero_grad()
        output = netD(real)
        errD = criterion(output, ones)
        errD.backward()
        optD.step()

        netG.zero_grad()
        fake = netG(noise)
        output = netD(fake)
        errG = criterion(output, ones)
        errG.backward()
        optG.step()
"""


def test_gan_two_optimizers_bce_outside_autocast() -> None:
    log = check(
        GAN,
        """\
import torch
import torch.nn as nn

netD = nn.Sequential(nn.Linear(2, 1), nn.Sigmoid())
netG = nn.Linear(4, 2).cuda()
criterion = nn.BCELoss()
optD = torch.optim.Adam(netD.parameters())
optG = torch.optim.Adam(netG.parameters())
scaler = torch.amp.GradScaler("cuda" if torch.cuda.is_available() else "cpu", enabled=torch.cuda.is_available())
for epoch in range(2):
    for real in loader:
        netD.zero_grad()
        with torch.autocast(device_type="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.float16, enabled=torch.cuda.is_available()):
            output = netD(real)
        errD = criterion(output.float(), ones)
        scaler.scale(errD).backward()
        scaler.step(optD)

        netG.zero_grad()
        with torch.autocast(device_type="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.float16, enabled=torch.cuda.is_available()):
            fake = netG(noise)
            output = netD(fake)
        errG = criterion(output.float(), ones)
        scaler.scale(errG).backward()
        scaler.step(optG)
        scaler.update()
""",
        amp="fp16",
    )
    assert sum("binary_cross_entropy" in c.description for c in log.changes) == 2


ACCUM = HEAD + """\
for epoch in range(2):
    optimizer.zero_grad()
    for step, (x, y) in enumerate(loader):
        logits = model(x)
        loss = criterion(logits, y)
        loss = loss / 4
        loss.backward()
        if (step + 1) % 4 == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
"""


def test_fp16_gradient_accumulation_with_clipping() -> None:
    check(
        ACCUM,
        HEAD
        + """\
scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
for epoch in range(2):
    optimizer.zero_grad()
    for step, (x, y) in enumerate(loader):
        with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            logits = model(x)
            loss = criterion(logits, y)
            loss = loss / 4
        scaler.scale(loss).backward()
        if (step + 1) % 4 == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
""",
        amp="fp16",
    )


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_already_autocast_does_nothing(amp: str) -> None:
    source = HEAD + """\
for x, y in loader:
    with torch.amp.autocast("cuda"):
        loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    code, log = run(source, amp)
    assert code == source
    assert not log.changes


def test_amp_off_does_nothing() -> None:
    code, log = run(TOPLEVEL, "off")
    assert code == TOPLEVEL
    assert not log.changes and not log.skipped
    assert not AddAutocast.enabled(ConvertOptions(amp="off"))


MANUAL_SGD = HEAD + """\
for x, y in loader:
    model.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.1)
"""


def test_manual_sgd_fp16_skipped_with_note() -> None:
    code, log = run(MANUAL_SGD, "fp16")
    assert code == MANUAL_SGD
    assert any("GradScaler" in s.reason and s.what == "autocast" for s in log.skipped)


def test_manual_sgd_bf16_still_applies() -> None:
    code, _ = run(MANUAL_SGD, "bf16")
    assert 'with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):\n        loss = criterion' in code


def test_loss_in_other_block_is_skipped() -> None:
    source = HEAD + """\
for x, y in loader:
    if True:
        loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""
    code, log = run(source)
    assert code == source
    assert any("different blocks" in s.reason for s in log.skipped)


def test_import_torch_added_when_missing() -> None:
    source = """\
from torch import nn, optim

model = nn.Linear(2, 2).cuda()
optimizer = optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
"""
    code, _ = run(source)
    assert code.startswith("from torch import nn, optim\nimport torch\n") or "import torch\n" in code
    assert "with torch.autocast(" in code


def test_a_script_that_never_uses_cuda_is_left_alone() -> None:
    """CPU autocast is slower and less precise for most models (pytorch/examples'
    regression needed 3x the batches to converge with it)."""
    source = HEAD.replace('torch.device("cuda" if torch.cuda.is_available() else "cpu")', '"cpu"') + TOPLEVEL[len(HEAD) :]
    code, log = run(source)
    assert code == dedent(source)
    assert [s.reason for s in log.skipped] == [
        "the script never uses CUDA: mixed precision pays off on GPUs, while CPU autocast"
        " is slower and less precise for most models"
    ]


EVAL_BCE = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=8)
model = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid()).cuda()
criterion = nn.BCELoss()
model.eval()
with torch.no_grad():
    for x, y in loader:
        out = model(x).squeeze()
        total += criterion(out, y).item()
"""


def test_evaluation_bce_gets_a_float32_input() -> None:
    """BCELoss rejects a bfloat16 output with a float32 target (pytorch/examples'
    siamese_network failed so in its test loop)."""
    check(
        EVAL_BCE,
        EVAL_BCE.replace(
            "        out = model(x).squeeze()\n",
            '        with torch.autocast(device_type="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):\n'
            "            out = model(x).squeeze()\n",
        ).replace("criterion(out, y)", "criterion(out.float(), y)"),
    )


GAN_STEP = """\
import torch
import torch.nn as nn

device = torch.device("cuda")
generator = nn.Linear(4, 2).to(device)
discriminator = nn.Sequential(nn.Linear(2, 1), nn.Sigmoid()).to(device)
adversarial_loss = nn.BCELoss()
optimizer_G = torch.optim.Adam(generator.parameters())
optimizer_D = torch.optim.Adam(discriminator.parameters())
for (real,) in loader:
    optimizer_G.zero_grad()
    gen_imgs = generator(z)
    g_loss = adversarial_loss(discriminator(gen_imgs), valid)
    g_loss.backward()
    optimizer_G.step()
    optimizer_D.zero_grad()
    real_loss = adversarial_loss(discriminator(real), valid)
    fake_loss = adversarial_loss(discriminator(gen_imgs.detach()), fake)
    d_loss = (real_loss + fake_loss) / 2
    d_loss.backward()
    optimizer_D.step()
"""


def test_an_output_reaching_a_model_outside_the_block_is_cast_back() -> None:
    """PyTorch-GAN's dcgan: the BCE loss (kept outside autocast) calls the discriminator
    on the generator's bfloat16 output: `Input type (c10::BFloat16) and bias type (float)`."""
    log = check(
        GAN_STEP,
        GAN_STEP.replace(
            "    gen_imgs = generator(z)\n",
            '    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):\n'
            "        gen_imgs = generator(z)\n",
        )
        .replace("discriminator(gen_imgs)", "discriminator(gen_imgs.float())")
        .replace("discriminator(gen_imgs.detach())", "discriminator(gen_imgs.detach().float())"),
    )
    assert sum("cast back to float32" in c.description for c in log.changes) == 2


def test_an_evaluation_loss_gets_float32_outputs() -> None:
    """The loss after an evaluation forward pass was computed on bfloat16 outputs (the
    printed val_loss values were exact bfloat16 numbers)."""
    source = EVAL_BCE.replace("nn.BCELoss()", "nn.MSELoss()")
    check(
        source,
        source.replace(
            "        out = model(x).squeeze()\n",
            '        with torch.autocast(device_type="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):\n'
            "            out = model(x).squeeze()\n",
        ).replace("criterion(out, y)", "criterion(out.float(), y)"),
    )


def test_a_loss_computed_in_the_block_is_not_cast() -> None:
    code, _ = run(TOPLEVEL.replace("optimizer.step()", "optimizer.step()\n        losses.append(criterion(out, y) + loss)"))
    assert "criterion(out.float(), y) + loss)" in code  # `out` is bf16; the loss is float32


BCE_HELPER = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=8)
model = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.Adam(model.parameters())


def loss_function(recon, x):
    return F.binary_cross_entropy(recon, x, reduction="sum")


for x in loader:
    optimizer.zero_grad()
    recon = torch.sigmoid(model(x))
    loss = loss_function(recon, x)
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("role", ["train", "eval"])
def test_a_loss_helper_computing_bce_is_left_to_the_user(role: str) -> None:
    """CUDA autocast rejects binary_cross_entropy, also inside a helper (pytorch/examples'
    VAE); which of the helper's inputs to make float32 is not known, so the loop is left
    alone, with the reason."""
    source = BCE_HELPER
    if role == "eval":
        source = source.replace("    loss.backward()\n    optimizer.step()\n", "").replace(
            "for x in loader:\n    optimizer.zero_grad()\n", "model.eval()\nfor x in loader:\n"
        )
    code, log = run(source)
    assert "autocast" not in code
    (skip,) = log.skipped
    assert skip.reason.startswith("`loss_function()` computes binary_cross_entropy")
