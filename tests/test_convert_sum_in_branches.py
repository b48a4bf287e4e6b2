"""A loss summed over the batch in branches (disentangling-VAE: `reduction="sum"` in each
branch of an `if` on the likelihood) and divided by the batch's own size after them, in
a helper that returns it, is a mean per sample: `--to ddp` scales nothing and refuses
nothing. The analysis reads the values of `loss` that reach each use (the last plain
assignment before it, or those of the branches in between), the batch size unpacked
from `x.size()` / `x.shape`, and a batch mean summed over the code (`.mean(0).sum()`) as a
mean. Branches mixing a sum with a mean, and a sum divided by a constant only, are still
refused."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR
from test_convert_ddp import SETUP, dedent, run_step

from autoaccel.convert import command
from autoaccel.convert.log import LOSS_CLOSE, ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.transforms.distributed import ScaleSummedLoss

DISVAE = """\
import torch.nn.functional as F
def reconstruction_loss(x, x_recon, distribution):
    {size}
    if distribution == "bernoulli":
        loss = F.binary_cross_entropy(x_recon, x, reduction="sum")
    elif distribution == "gaussian":
        loss = {gaussian}
    else:
        loss = F.l1_loss(x_recon, x, reduction="sum")
        loss = loss * 3
    {divided}
def kl_divergence(mu, logvar):
    latent_kl = 0.5 * (-1 - logvar + mu.pow(2) + logvar.exp()).mean(dim=0)
    return latent_kl.sum()
for x in loader:
    x_recon, mu, logvar = model(x)
    loss = reconstruction_loss(x, x_recon, dist) + beta * kl_divergence(mu, logvar)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
SUMMED = 'F.mse_loss(x_recon * 255, x * 255, reduction="sum") / 255'


def backward_line(body: str) -> int:
    return SETUP.count("\n") + body.splitlines().index("    loss.backward()") + 1


def disvae(
    size="batch_size, n_chan = x_recon.size()",
    gaussian=SUMMED,
    divided="loss = loss / batch_size\n    return loss",
) -> str:
    return DISVAE.format(size=size, gaussian=gaussian, divided=divided)


@pytest.mark.parametrize(
    "body",
    [
        disvae(),
        disvae(size="batch_size, n_chan = x.shape"),
        disvae(size="batch_size = x.size(0)", divided="return loss / batch_size"),
        disvae(gaussian='F.mse_loss(x_recon, x, reduction="sum")'),
    ],
    ids=["unpacked-size", "unpacked-shape", "returned", "all-plain-sums"],
)
def test_sums_chosen_in_branches_then_divided_by_the_batchs_size_are_a_mean(body):
    code, log = run_step(ScaleSummedLoss, body)
    assert (code, log.changes, log.skipped) == (body, [], [])


def test_a_sum_rebound_to_a_mean_is_a_mean():
    body = """\
        for x, y in loader:
            loss = F.mse_loss(model(x), y, reduction="sum")
            loss = loss / x.size(0)
            loss.backward()
        """
    code, log = run_step(ScaleSummedLoss, body)
    assert (code, log.changes, log.skipped) == (dedent(body), [], [])


def test_a_branch_with_a_mean_among_sums_is_still_refused():
    body = disvae(gaussian="F.mse_loss(x_recon, x)")
    code, log = run_step(ScaleSummedLoss, body)
    assert code == body and not log.changes
    assert [(s.what, s.line, s.wrong) for s in log.skipped] == [
        ("summed loss", backward_line(body), True)
    ]
    assert "mixes a sum over the batch" in log.skipped[0].reason


def test_a_sum_divided_by_a_constant_only_is_refused_as_scaled():
    body = disvae(divided="return loss").replace(" + beta * kl_divergence(mu, logvar)", "")
    code, log = run_step(ScaleSummedLoss, body)
    assert code == body and not log.changes
    assert [(s.what, s.line, s.wrong) for s in log.skipped] == [
        ("summed loss", backward_line(body), True)
    ]
    assert "divides the sum by a number not known to be the size" in log.skipped[0].reason


@pytest.mark.parametrize(
    "kl, scaled",
    [("(...).mean(dim=0).sum()", False), ("(...).mean(1).sum()", True)],
    ids=["batch-mean", "per-sample-mean"],
)
def test_a_sum_of_a_batch_mean_is_a_mean(kl, scaled):
    body = f"""\
        for x in loader:
            mu = model(x)
            loss = {kl.replace("...", "mu.pow(2) - 1")}
            loss.backward()
        """
    code, log = run_step(ScaleSummedLoss, body)
    assert ("(loss * WORLD_SIZE).backward()" in code) is scaled
    assert not log.skipped


def test_the_fixture_converts_with_nothing_scaled_or_refused():
    name = "ddp/sum_in_branches.py"
    source = (FIXTURES_DIR / name).read_text()
    conversion = convert_source(source, ConvertOptions(target="ddp", amp="off"), name)
    assert "        loss.backward()\n" in conversion.converted
    assert "WORLD_SIZE).backward()" not in conversion.converted
    assert not [s for s in conversion.log.skipped if s.wrong]


# F3 (DeepLab's shape): a mean divided again by the batch's size. Each process divides by
# the size of its share, so its loss and gradient are WORLD_SIZE times the original's; the
# divisor becomes the whole batch's (`n * WORLD_SIZE`), which restores both.
WIDENED = "  # DDP: the whole batch's size"
SEGMENTATION = """\
from torch import nn
def segmentation_loss(logit, target):
    {size}
    criterion = nn.CrossEntropyLoss(ignore_index=255)
    loss = criterion(logit, target)
    {divided}
    return loss
for x, y in loader:
    loss = segmentation_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize(
    "size, divided, widened",
    [
        ("n, c, h, w = logit.size()", "loss /= n", "loss /= n * WORLD_SIZE"),
        ("n = logit.size(0)", "loss = loss / n", "loss = loss / (n * WORLD_SIZE)"),
        ("n = len(target)", "loss = loss.div(n)", "loss = loss.div(n * WORLD_SIZE)"),
        ("pass", "loss = loss / logit.shape[0]", "loss = loss / (logit.shape[0] * WORLD_SIZE)"),
    ],
    ids=["augmented", "divided", "div", "shape"],
)
def test_a_mean_divided_by_its_batchs_size_is_divided_by_the_whole_batchs(size, divided, widened):
    body = SEGMENTATION.format(size=size, divided=divided)
    code, log = run_step(ScaleSummedLoss, body)
    assert code == body.replace(f"    {divided}\n", f"    {widened}{WIDENED}\n")
    assert [c.line for c in log.changes] == [SETUP.count("\n") + 6] and not log.skipped


@pytest.mark.parametrize(
    "divided", ["loss /= 2", "loss = loss / args.batch_size"], ids=["constant", "argument"]
)
def test_a_mean_divided_by_anything_else_is_left_alone(divided):
    body = SEGMENTATION.format(size="n = logit.size(0)", divided=divided)
    code, log = run_step(ScaleSummedLoss, body)
    assert (code, log.changes, log.skipped) == (body, [], [])


def test_a_mean_divided_by_its_batchs_size_under_a_condition_is_left_to_the_proof():
    """Which value reaches `backward()` depends on the branch that runs: the proof run's
    loss check decides (a division that runs shows as twice the original's loss)."""
    body = SEGMENTATION.format(
        size="n = logit.size(0)", divided="if batch_average:\n        loss /= n"
    )
    code, log = run_step(ScaleSummedLoss, body)
    assert code == body and not log.changes
    (skip,) = log.skipped
    assert skip.wrong and skip.proof == LOSS_CLOSE and "different branches" in skip.reason


def test_a_loss_reduced_differently_in_exclusive_branches_is_left_to_the_proof():
    """deep-text-recognition-benchmark (sixth set, re-judged): `cost = ctc(...) / batch_size`
    under `if baiduCTC:` (a summed CTC), `cost = ctc(...)` (torch's mean) otherwise, with
    `ctc` either loss: read as one sum mixed with other terms, it was refused."""
    body = """\
        for x, y in loader:
            batch_size = x.size(0)
            if summed:
                cost = criterion(model(x), y) / batch_size
            else:
                cost = criterion(model(x), y)
            optimizer.zero_grad()
            cost.backward()
            optimizer.step()
        """
    setup = dedent("""\
        if summed:
            criterion = torch.nn.MSELoss(reduction="sum")
        else:
            criterion = torch.nn.MSELoss()
        """)
    code, log = run_step(ScaleSummedLoss, setup + dedent(body))
    (skip,) = log.skipped
    assert skip.proof == LOSS_CLOSE and not log.changes


def test_a_mean_divided_by_a_per_process_batchs_size_is_left_alone():
    body = SEGMENTATION.format(size="n = logit.size(0)", divided="loss /= n")
    options = ConvertOptions(target="ddp", amp="off", per_process_batch=True)
    code, log = run_step(ScaleSummedLoss, body, options)
    assert (code, log.changes, log.skipped) == (body, [], [])


def test_the_mean_fixture_divides_by_the_whole_batchs_size():
    name = "ddp/mean_over_batch_size.py"
    source = (FIXTURES_DIR / name).read_text()
    conversion = convert_source(source, ConvertOptions(target="ddp", amp="off"), name)
    assert f"    loss /= n * WORLD_SIZE{WIDENED}\n" in conversion.converted
    assert not [s for s in conversion.log.skipped if s.wrong]


def test_a_mean_divided_by_its_batchs_size_in_another_module_is_refused_with_where(
    tmp_path, capsys
):
    """The divisor is widened in the module being converted only: one in a helper module
    is refused, naming its line."""
    fixture = (FIXTURES_DIR / "ddp" / "mean_over_batch_size.py").read_text()
    start, end = fixture.index("def segmentation_loss"), fixture.index("model = ")
    (tmp_path / "losses.py").write_text("from torch import nn\n\n\n" + fixture[start:end])
    script = fixture[:start] + "from losses import segmentation_loss\n\n\n" + fixture[end:]
    (tmp_path / "train.py").write_text(script)
    options = ConvertOptions(target="ddp", amp="off")
    assert command.run_convert(tmp_path / "train.py", options, write=True) == 1
    err = capsys.readouterr().err
    assert "mean divided again by the batch's size at losses.py:8" in err
