"""Fixes that must not change what trains, proven by running a tiny script before and
after `lint --fix` (with and without `--unsafe-fixes`) and `convert`.

Every safe fix has a run here: a tiny CPU script that triggers it trains two steps
before and after the fix, and must end with bit-identical parameters and the same
global random state (`torch.get_rng_state()`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoaccel.config import LintSettings
from autoaccel.lint.fixer import fix_source
from autoaccel.lint.rule import Applicability
from running import run_autoaccel, run_script

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.runs

# Dreambooth's prior preservation: `loss = loss + w * prior_loss` sums two terms of
# one step (the instance loss is defined in branches, as in diffusers' scripts), and
# `running += loss` accumulates across steps for the log.
PRIOR_PRESERVATION = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(5)]
use_prior, weighted = True, False
running = 0.0
for x, y in batches:
    optimizer.zero_grad()
    pred = model(x)
    if use_prior:
        pred, pred_prior = pred.chunk(2)
        y, y_prior = y.chunk(2)
        prior_loss = F.mse_loss(pred_prior, y_prior)
    if weighted:
        loss = (F.mse_loss(pred, y, reduction="none") * 2).mean()
    else:
        loss = F.mse_loss(pred, y)
    if use_prior:
        loss = loss + 0.5 * prior_loss
    loss.backward()
    optimizer.step()
    running += loss
print(repr(running.item()))
print(model.weight.tolist(), model.bias.tolist())
"""


def _trained(script: Path) -> str:
    """What the script prints: the logged loss sum and the trained parameters."""
    result = run_script(script)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def trained_before(tmp_path_factory) -> str:
    """What the original prints: the same for every rewrite (it seeds torch), so run once."""
    script = tmp_path_factory.mktemp("original") / "dreambooth.py"
    script.write_text(PRIOR_PRESERVATION)
    return _trained(script)


@pytest.mark.parametrize(
    "rewrite",
    [
        pytest.param(["lint", "--fix"], id="lint-fix"),
        pytest.param(["lint", "--fix", "--unsafe-fixes"], id="lint-unsafe-fixes"),
        pytest.param(["convert", "--write"], id="convert"),
    ],
)
def test_prior_preservation_trains_the_same_after_rewriting(tmp_path, rewrite, trained_before):
    script = tmp_path / "dreambooth.py"
    script.write_text(PRIOR_PRESERVATION)
    result = run_autoaccel(*rewrite, script, cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    rewritten = script.read_text()
    assert "loss = loss + 0.5 * prior_loss\n" in rewritten
    assert _trained(script) == trained_before
    # Only the accumulation across steps is reported; read only through `.item()`, its
    # `.detach()` fix is safe, so every rewrite applies it.
    assert "running += loss.detach()" in rewritten


# -- every safe fix, run before and after ------------------------------------------------
# Each script trains `model` two steps; the epilogue prints the parameters exactly and a
# digest of the global random state. Scripts run with one thread (bit-identical sums).
PRELUDE = """\
import hashlib
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
dataset = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
"""
EPILOGUE = """
print([p.tolist() for p in model.parameters()])
print(hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest())
"""
TRAIN = """\
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""

SAFE_FIX_SCRIPTS = {
    "ACC102": """\
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(dataset, batch_size=8, shuffle=True)
for x, y in loader:
    optimizer.zero_grad()
    F.mse_loss(model(x.to(device)), y.to(device)).backward()
    optimizer.step()
""",
    "ACC104": """\
distributed = False
sampler = torch.utils.data.DistributedSampler(dataset) if distributed else None
loader = DataLoader(dataset, batch_size=8, shuffle=True, sampler=sampler)
for x, y in loader:
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()
""",
    "ACC203": """\
total = 0.0
for x, y in DataLoader(dataset, batch_size=8, shuffle=True):
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    total += loss
print(f"{total.item():.6f}")
""",
    "ACC205": """\
for x, y in DataLoader(dataset, batch_size=8, shuffle=True):
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    torch.cuda.empty_cache()
""",
    "ACC206": """\
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
for x, y in DataLoader(dataset, batch_size=8, shuffle=True):
    optimizer.zero_grad()
    bias = torch.full((x.size(0), 1), 0.5).to(device)
    F.mse_loss(model(x.to(device)) + bias, y.to(device)).backward()
    optimizer.step()
""",
    "ACC302": """\
scaler = torch.cuda.amp.GradScaler(enabled=False)
for x, y in DataLoader(dataset, batch_size=8, shuffle=True):
    optimizer.zero_grad()
    with torch.cpu.amp.autocast():
        loss = F.mse_loss(model(x), y)
    scaler.scale(loss.float()).backward()
    scaler.step(optimizer)
    scaler.update()
""",
    # `Variable` of a batch goes; of a layer's output it becomes `.detach()` (the
    # first layer then gets no gradient, before and after); a fresh hidden state.
    "ACC501": """\
from torch.autograd import Variable
head = torch.nn.Linear(1, 1)
optimizer.add_param_group({"params": head.parameters()})
for x, y in DataLoader(dataset, batch_size=8, shuffle=True):
    x, y = Variable(x), Variable(y)
    optimizer.zero_grad()
    h = Variable(model(x))
    scale = Variable(torch.ones(1), requires_grad=True)
    F.mse_loss(head(h) * scale, y).backward()
    optimizer.step()
print(head.weight.tolist(), scale.grad.tolist())
""",
    "ACC502": """\
from torch.autograd import Variable
loader = DataLoader(dataset, batch_size=8, shuffle=True)
for x, y in loader:
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()
model.eval()
for x, y in loader:
    x = Variable(x, volatile=True)
    print(model(x).sum().item())
""",
    "ACC504": """\
loader = DataLoader(dataset, batch_size=8, shuffle=True)
for x, y in loader:
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()
model.eval()
for x, y in loader:
    print(F.mse_loss(model(x), y).item())
""",
}
# What the fix writes, to be sure it ran.
SAFE_FIX_WRITES = {
    "ACC102": "pin_memory=torch.cuda.is_available()",
    "ACC104": "shuffle=sampler is None",
    "ACC203": "total += loss.detach()",
    "ACC205": "optimizer.step()\n" + EPILOGUE,
    "ACC206": "torch.full((x.size(0), 1), 0.5, device=device)",
    "ACC302": 'torch.autocast("cpu")',
    "ACC501": "h = model(x).detach()",
    "ACC502": "for x, y in loader:\n    print(model(x).sum().item())",
    "ACC504": "with torch.no_grad():",
}


def _run_script(path: Path, source: str) -> str:
    path.write_text(source)
    return _trained(path)


def _safe_fix(source: str, code: str) -> str:
    """`autoaccel lint --fix --select CODE`: safe fixes only."""
    result = fix_source(source, LintSettings(select=(code,), unsafe_fixes=False))
    return result.source


def test_every_safe_fix_has_a_run():
    """The rules whose fixes are safe (all, or some) are exactly those run below."""
    from autoaccel.rules import all_rules

    safe = {
        rule.code
        for rule in all_rules()
        if rule.fix_title is not None
        and (rule.applicability is Applicability.SAFE or rule.unsafe_for)
    }
    # ACC503 (`.data[0]`) crashes before its fix on current torch: run on its own below.
    assert safe == set(SAFE_FIX_SCRIPTS) | {"ACC503"}


@pytest.mark.parametrize("code", sorted(SAFE_FIX_SCRIPTS))
def test_safe_fix_trains_the_same(tmp_path, code):
    source = PRELUDE + TRAIN + SAFE_FIX_SCRIPTS[code] + EPILOGUE
    after = _safe_fix(source, code)
    assert SAFE_FIX_WRITES[code] in after and after != source
    before_out = _run_script(tmp_path / "before.py", source)
    after_out = _run_script(tmp_path / "after.py", after)
    assert after_out == before_out


def test_zero_dim_index_fix_trains_like_item(tmp_path):
    """ACC503: `loss.data[0]` raises IndexError today, so compare with `float(loss)`."""
    body = """\
total = 0.0
for x, y in DataLoader(dataset, batch_size=8, shuffle=True):
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    total += loss.data[0]
print(repr(total))
"""
    source = PRELUDE + TRAIN + body + EPILOGUE
    after = _safe_fix(source, "ACC503")
    assert "total += loss.item()" in after
    reference = source.replace("loss.data[0]", "float(loss)")
    assert _run_script(tmp_path / "after.py", after) == _run_script(
        tmp_path / "reference.py", reference
    )
