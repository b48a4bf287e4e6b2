"""AddAutocast (ACC301): forward pass and loss under torch.autocast; fp16 GradScaler."""

from __future__ import annotations

from pathlib import Path
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
        HEAD + """\
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
        HEAD + """\
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
        '        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.device.type == "cuda")\n',
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
        HEAD + """\
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
    assert (
        'with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):\n        loss = criterion'
        in code
    )


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
    assert (
        code.startswith("from torch import nn, optim\nimport torch\n") or "import torch\n" in code
    )
    assert "with torch.autocast(" in code


def test_a_script_that_never_uses_cuda_is_left_alone() -> None:
    """CPU autocast is slower and less precise for most models (pytorch/examples'
    regression needed 3x the batches to converge with it)."""
    source = (
        HEAD.replace('torch.device("cuda" if torch.cuda.is_available() else "cpu")', '"cpu"')
        + TOPLEVEL[len(HEAD) :]
    )
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
    code, _ = run(
        TOPLEVEL.replace(
            "optimizer.step()", "optimizer.step()\n        losses.append(criterion(out, y) + loss)"
        )
    )
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


# -- micro-batches: backward() in a loop over chunks of the batch ------------------------
MICRO = HEAD + """\
loader = torch.utils.data.DataLoader(dataset, batch_size=32)
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        for mx, my in zip(x.chunk(4), y.chunk(4)):
            loss = criterion(model(mx), my) / 4
            loss.backward()
        optimizer.step()
"""
AUTOCAST_BF16 = 'with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):'
AUTOCAST_FP16 = AUTOCAST_BF16.replace("bfloat16", "float16")


def test_micro_batch_loop_bf16_wraps_each_chunks_forward_and_loss() -> None:
    log = check(
        MICRO,
        MICRO.replace(
            "            loss = criterion(model(mx), my) / 4\n",
            f"            {AUTOCAST_BF16}\n                loss = criterion(model(mx), my) / 4\n",
        ),
    )
    assert [(c.code, c.line) for c in log.changes] == [("ACC301", 13)]
    assert not log.skipped


def test_micro_batch_loop_fp16_scales_each_backward_and_steps_once() -> None:
    check(
        MICRO,
        MICRO.replace(
            "for epoch in range(2):\n",
            'scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")\nfor epoch in range(2):\n',
        )
        .replace(
            "            loss = criterion(model(mx), my) / 4\n            loss.backward()\n",
            f"            {AUTOCAST_FP16}\n                loss = criterion(model(mx), my) / 4\n"
            "            scaler.scale(loss).backward()\n",
        )
        .replace(
            "        optimizer.step()\n",
            "        scaler.step(optimizer)\n        scaler.update()\n",
        ),
        amp="fp16",
    )


def test_micro_batch_loop_in_a_step_function() -> None:
    source = HEAD + """\
loader = torch.utils.data.DataLoader(dataset, batch_size=32)


def train_step(x, y):
    optimizer.zero_grad()
    for mx, my in zip(x.chunk(2), y.chunk(2)):
        out = model(mx)
        loss = criterion(out, my) / 2
        loss.backward()
    optimizer.step()


for x, y in loader:
    train_step(x, y)
"""
    check(
        source,
        source.replace(
            "        out = model(mx)\n        loss = criterion(out, my) / 2\n",
            f"        {AUTOCAST_BF16}\n            out = model(mx)\n            loss = criterion(out, my) / 2\n",
        ),
    )


def test_micro_batch_backward_nested_further_is_left_to_the_user() -> None:
    source = MICRO.replace(
        "            loss.backward()\n",
        "            if loss.requires_grad:\n                loss.backward()\n",
    )
    code, log = run(source)
    assert code == dedent(source)
    assert any("micro-batch loop" in s.reason for s in log.skipped)


def test_micro_batch_whose_forward_ran_before_the_chunks_is_left_to_the_user() -> None:
    """The model ran on the whole batch: no model call in the chunk loop to wrap."""
    source = MICRO.replace(
        "        for mx, my in zip(x.chunk(4), y.chunk(4)):\n            loss = criterion(model(mx), my) / 4\n",
        "        out = model(x)\n        for mo, my in zip(out.chunk(4), y.chunk(4)):\n            loss = criterion(mo, my) / 4\n",
    ).replace("loss.backward()", "loss.backward(retain_graph=True)")
    code, log = run(source)
    assert code == dedent(source)
    assert any("no model call found" in s.reason for s in log.skipped)


# -- the step in a function of another module of the project ----------------------------
STEP_SCRIPT = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

import mylib

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(dataset, batch_size=16)
model = nn.Linear(8, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for x, y in loader:
        mylib.train_step(model, opt, x.to(device), y.to(device))
"""
STEP_LIB = """\
import torch.nn.functional as F


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    out = model(x)
    loss = F.mse_loss(out, y)
    loss.backward()
    optimizer.step()
    return loss.item()
"""


def run_project(files: dict[str, str], amp: str = "bf16") -> dict[str, tuple[str, ConversionLog]]:
    """AddAutocast over each file of a project (`train.py` is the script, the others are
    modules named after their files), each analysed with the others, as
    `convert_project` runs a step."""
    from autoaccel.analysis.index import ModuleIndex
    from autoaccel.analysis.program import SourceModule
    from autoaccel.analysis.script_model import ProjectContext
    from autoaccel.convert.transform import StepContext

    trees = {path: cst.parse_module(dedent(text)) for path, text in files.items()}
    names = {path: "__main__" if path == "train.py" else path.removesuffix(".py") for path in files}
    modules = {
        path: SourceModule(names[path], tree, ModuleIndex(tree), path)
        for path, tree in trees.items()
    }
    results = {}
    for path, tree in trees.items():
        log = ConversionLog()
        others = tuple(module for other, module in modules.items() if other != path)
        project = ProjectContext(names[path], "", path, others)
        shared = StepContext(
            ConvertOptions(amp=amp), log, project=project, entry=path == "train.py"
        )
        context = shared.codemod_context(path)
        out = AddAutocast(context).transform_module(tree)  # type: ignore[arg-type]
        results[path] = (out.code, log)
    return results


def test_step_in_another_module_is_wrapped_there() -> None:
    results = run_project({"train.py": STEP_SCRIPT, "mylib.py": STEP_LIB})
    script, script_log = results["train.py"]
    assert script == STEP_SCRIPT
    assert not script_log.changes and not script_log.skipped  # mylib.py's conversion says it
    lib, log = results["mylib.py"]
    fallback = '"cuda" if torch.cuda.is_available() else "cpu"'
    assert lib == STEP_LIB.replace("import torch.nn", "import torch\nimport torch.nn").replace(
        "    out = model(x)\n    loss = F.mse_loss(out, y)\n",
        f"    with torch.autocast(device_type={fallback}, dtype=torch.bfloat16, enabled=torch.cuda.is_available()):\n"
        "        out = model(x)\n        loss = F.mse_loss(out, y)\n",
    )
    assert [(c.code, c.line) for c in log.changes] == [("ACC301", 6)]
    again = run_project({"train.py": script, "mylib.py": lib})
    assert again["mylib.py"][0] == lib and again["train.py"][0] == script, "not idempotent"


def test_step_in_another_module_fp16_is_left_to_the_user_there() -> None:
    results = run_project({"train.py": STEP_SCRIPT, "mylib.py": STEP_LIB}, amp="fp16")
    assert results["mylib.py"][0] == dedent(STEP_LIB)
    (skip,) = results["mylib.py"][1].skipped
    assert skip.line == 4 and "GradScaler that lives across calls of `train_step()`" in skip.reason


def test_step_in_another_module_of_a_cpu_only_script_is_left_alone() -> None:
    cpu = STEP_SCRIPT.replace(
        'torch.device("cuda" if torch.cuda.is_available() else "cpu")', '"cpu"'
    )
    results = run_project({"train.py": cpu, "mylib.py": STEP_LIB})
    assert results["mylib.py"] == (dedent(STEP_LIB), ConversionLog())
    assert ["never uses CUDA" in s.reason for s in results["train.py"][1].skipped] == [True]


def test_the_conversion_of_a_project_rewrites_the_module_of_its_step_function() -> None:
    """`find_project` rewrites the module that holds only the step function a loop calls."""
    from pathlib import Path

    from autoaccel.convert.project_conversion import find_project
    from autoaccel.fileio import read_source

    script = (
        Path(__file__).resolve().parent.parent / "fixtures" / "amp" / "step_module" / "train.py"
    )
    project = find_project(script, read_source(script))
    assert project is not None
    assert [f.path.name for f in project.files] == ["train.py", "mylib.py"]


def test_step_in_another_module_called_under_autocast_is_left_alone() -> None:
    script = STEP_SCRIPT.replace(
        "        mylib.train_step(",
        '        with torch.autocast("cuda"):\n            mylib.train_step(',
    )
    results = run_project({"train.py": script, "mylib.py": STEP_LIB})
    assert results["mylib.py"] == (dedent(STEP_LIB), ConversionLog())


def test_numpy_of_an_autocast_output_is_cast_to_float32_first():
    """fixtures/amp/numpy_outputs.py (siamese-pytorch's evaluation, ninth unseen set): NumPy
    has no bfloat16, so `.numpy()` of an output computed under autocast raised on a GPU."""
    source = (Path(__file__).parent.parent / "fixtures" / "amp" / "numpy_outputs.py").read_text()
    code, log = run(source)
    assert "        preds = out.detach().cpu().float().numpy()\n" in code
    assert "                scores = net(x).data.cpu().float().numpy()\n" in code
    assert run(code)[0] == code, "not idempotent"
    assert sum("before `.numpy()`" in c.description for c in log.changes) == 2
