"""`--to ddp|fsdp` refuses a training loss that pairs the samples of a batch with each
other: each process would pair only those of its share (half the negatives of a contrastive
loss on two processes). Before, the twelfth unseen set's SimCLR converted to DDP with the
per-process NT-Xent, an initial loss of log(15) instead of log(31), within the proof's
tolerance. A loss of each sample alone, and a product of weights, convert."""

from __future__ import annotations

import textwrap

import pytest
from running import FIXTURES_DIR

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

DP_FIXTURES = FIXTURES_DIR / "dp"

STEP = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 8)), batch_size=16)
    encoder = nn.Linear(8, 4)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
    for x1, x2 in loader:
        z1, z2 = F.normalize(encoder(x1), dim=1), F.normalize(encoder(x2), dim=1)
    {loss}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """)


def _refusals(source: str, target: str) -> list[tuple[int | None, str]]:
    conversion = convert_source(source, ConvertOptions(target=target, amp="off"), "train.py")
    return [(s.line, s.reason) for s in conversion.log.skipped if s.wrong]


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
@pytest.mark.parametrize(
    "name, line, how",
    [
        (
            "contrastive_pairs.py",
            33,
            "`nt_xent(...)` compares every sample with every other: `z @ z.t()`",
        ),
        (
            "triplet_mining.py",
            45,
            "`loss_fn(...)` (`OnlineTripletLoss.forward`) indexes `embeddings`",
        ),
    ],
)
def test_a_loss_pairing_samples_of_the_batch_is_refused(name, line, how, target):
    refusals = _refusals((DP_FIXTURES / name).read_text(), target)
    assert [r for r in refusals if r[0] == line and r[1].startswith(how)], refusals
    assert "each process would pair only the samples of its share" in refusals[0][1]


def test_a_similarity_matrix_in_the_step_itself_is_refused():
    source = STEP.format(loss="    loss = F.cross_entropy(z1 @ z2.t(), torch.arange(len(z1)))")
    assert _refusals(source, "ddp") == [
        (
            11,
            "this step compares every sample with every other: `z1 @ z2.t()`: each process"
            " would pair only the samples of its share of the batch, so the loss would not be"
            " the original's; gather every process's embeddings before the loss by hand"
            " (`torch.distributed.nn.functional.all_gather`, which passes gradients back)",
        )
    ]


@pytest.mark.parametrize(
    "loss",
    [
        "    loss = (z1 - z2).pow(2).sum(1).mean()",  # each sample with its own other view
        # an orthogonality penalty: a product of the weights, not of the batch
        "    loss = (z1 - z2).pow(2).mean() + (encoder.weight @ encoder.weight.t()).mean()",
    ],
    ids=["per-sample", "weights"],
)
def test_a_loss_of_each_sample_alone_converts(loss):
    assert _refusals(STEP.format(loss=loss), "ddp") == []
