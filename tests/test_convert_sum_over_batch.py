"""A loss summed over the batch and divided by the batch's own size is a mean per sample
(Beta-VAE: `F.binary_cross_entropy_with_logits(..., size_average=False).div(batch_size)`
after `batch_size = x.size(0)`): each process divides by the size of its share and DDP
averages, so `--to ddp` scales nothing. A sum divided by anything else (a constant, the
dataset's size) is still refused: no single factor is known to restore the original."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR
from test_convert_ddp import SETUP, dedent, run_step

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.transforms.distributed import ScaleSummedLoss

BETA_VAE = """\
import torch.nn.functional as F
def reconstruction_loss(x, x_recon):
    batch_size = x.size(0)
    return {recon}
def kl_divergence(mu, logvar):
    return -0.5 * (1 + logvar - mu**2 - logvar.exp()).sum(1).mean(0)
for x in loader:
    x_recon, mu, logvar = model(x)
    loss = reconstruction_loss(x, x_recon) + beta * kl_divergence(mu, logvar)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
BCE = "F.binary_cross_entropy_with_logits(x_recon, x, {})"


@pytest.mark.parametrize(
    "recon",
    [
        BCE.format("size_average=False") + ".div(batch_size)",
        BCE.format('reduction="sum"') + " / x.size(0)",
        BCE.format('reduction="sum"') + " / len(x)",
        BCE.format('reduction="sum"') + ".div(x.shape[0])",
        BCE.format('reduction="sum"') + " / batch_size",
        BCE.format('reduction="sum"') + " / x.size()[0]",
        BCE.format('reduction="sum"') + " / x.size(0) / 1000",
    ],
    ids=["div-name", "size", "len", "div-shape", "name", "size-subscript", "and-a-constant"],
)
def test_a_sum_divided_by_its_batchs_size_is_a_mean(recon):
    body = BETA_VAE.format(recon=recon)
    code, log = run_step(ScaleSummedLoss, body)
    assert (code, log.changes, log.skipped) == (body, [], [])


def test_a_sum_divided_by_the_size_of_a_name_bound_in_the_loop_is_a_mean():
    body = """\
        for x, y in loader:
            out = model(x)
            n = y.shape[0]
            loss = F.mse_loss(out, y, reduction="sum") / n
            loss.backward()
        """
    code, log = run_step(ScaleSummedLoss, body)
    assert (code, log.changes, log.skipped) == (dedent(body), [], [])


def test_a_sum_of_an_unpacked_model_output_over_its_batchs_size_is_a_mean():
    """overhaul-distillation (tenth unseen set): the distiller returns its distillation
    sum beside the logits; `/ batch_size / 1000` after `batch_size = inputs.shape[0]`."""
    body = """\
        for inputs, targets in loader:
            batch_size = inputs.shape[0]
            outputs, loss_distill = model(inputs)
            loss_ce = criterion(outputs, targets)
            loss = loss_ce + loss_distill.sum() / batch_size / 1000
            loss.backward()
        """
    code, log = run_step(ScaleSummedLoss, body)
    assert (code, log.changes, log.skipped) == (dedent(body), [], [])


@pytest.mark.parametrize(
    "recon",
    [
        BCE.format("size_average=False") + ".div(64)",
        BCE.format('reduction="sum"') + " / args.batch_size",
        BCE.format('reduction="sum"') + " / len(loader.dataset)",
        BCE.format('reduction="sum"') + ".div(batch_size + 1)",
    ],
    ids=["constant", "argument", "dataset", "not-a-size"],
)
def test_a_sum_divided_by_anything_else_is_still_refused(recon):
    body = BETA_VAE.format(recon=recon)
    code, log = run_step(ScaleSummedLoss, body)
    assert code == body and not log.changes
    (skip,) = log.skipped
    assert skip.what == "summed loss" and skip.wrong and skip.line == SETUP.count("\n") + 11


def test_a_batch_size_name_bound_to_a_constant_is_not_the_batchs_size():
    body = BETA_VAE.format(recon=BCE.format('reduction="sum"') + " / batch_size").replace(
        "batch_size = x.size(0)", "batch_size = 64"
    )
    code, log = run_step(ScaleSummedLoss, body)
    assert [skip.what for skip in log.skipped] == ["summed loss"]


def test_a_plain_sum_is_still_multiplied_by_world_size():
    body = BETA_VAE.format(recon=BCE.format('reduction="sum"')).replace(".mean(0)", ".sum()")
    code, log = run_step(ScaleSummedLoss, body)
    assert code == body.replace(
        "loss.backward()", "(loss * WORLD_SIZE).backward()  # a sum: DDP averages over processes"
    )


def test_the_fixture_converts_with_nothing_scaled_or_refused():
    name = "ddp/sum_over_batch_size.py"
    source = (FIXTURES_DIR / name).read_text()
    conversion = convert_source(source, ConvertOptions(target="ddp", amp="off"), name)
    assert "        loss.backward()\n" in conversion.converted
    assert "WORLD_SIZE).backward()" not in conversion.converted
    assert not [s for s in conversion.log.skipped if s.wrong]


@pytest.mark.parametrize(
    "recon",
    [
        "1 - (2 * (x_recon * x).sum() + 1) / (x_recon.sum() + x.sum() + 1)",
        "(x_recon * x).sum() / x.sum()",
    ],
    ids=["dice", "plain"],
)
def test_a_ratio_of_two_sums_over_the_batch_is_left_as_it_is(recon):
    """A Dice loss (brain-segmentation U-Net's): a sum over the batch divided by another is
    free of the batch's size, as a mean is; before its loss class was read, it was taken
    for a mean unread, and reading it must not turn it into a refused mix of sums."""
    body = BETA_VAE.format(recon=recon)
    code, log = run_step(ScaleSummedLoss, body)
    assert (code, log.changes, log.skipped) == (body, [], [])
