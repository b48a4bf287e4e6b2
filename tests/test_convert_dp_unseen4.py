"""`--to dp` on shapes of the fifth unseen-code measurement (bench31): an annotated
assignment between the forward pass and the loss (`out: Union[...] = criterion(...)`,
kd_study) was refused as "a `simplestatementline` block"; it is a plain line, and its
annotation, never evaluated for a local variable, is not an input of the loss."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
DP = ConvertOptions(target="dp", amp="off")


def convert(name: str, replace: tuple[str, str] = ("", "")):
    source = (FIXTURES / name).read_text(encoding="utf-8").replace(*replace)
    return convert_source(source, DP, name)


def test_annotated_forward_and_loss_lines_move_into_the_loss_function() -> None:
    conversion = convert("annotated_step.py")
    assert [s for s in conversion.log.skipped if s.wrong] == []
    assert (
        "    def compute_loss(model, criterion, x, y):\n"
        "        # runs on each GPU's part of the batch\n"
        "        out: Union[Tensor, tuple] = model(x)\n"
        "        loss: Tensor = criterion(out, y)\n"
        "        return loss\n"
    ) in conversion.converted
    assert "            loss = loss_on_gpus(x, y).mean()" in conversion.converted


def test_a_bare_annotation_stays_in_the_loop() -> None:
    """`loss: Tensor` alone binds nothing: it stays where it is, the loss moves."""
    conversion = convert(
        "annotated_step.py",
        ("loss: Tensor = criterion", "loss: Tensor\n            loss = criterion"),
    )
    assert [s for s in conversion.log.skipped if s.wrong] == []
    assert "        loss = criterion(out, y)\n        return loss\n" in conversion.converted
    assert "            loss: Tensor\n" in conversion.converted


def test_a_line_that_assigns_nothing_in_an_autocast_block_is_quoted():
    """wgan-gp (the tenth unseen set): the refusal named "a `simplestatementline` block"
    for `self.losses['GP'].append(...)` between the forward pass and the loss."""
    source = dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = nn.Linear(4, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
        history = []
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast("cuda", enabled=False):
                out = model(x)
                history.append(out.mean().item())
                loss = nn.functional.mse_loss(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """)
    conversion = convert_source(source, ConvertOptions(target="dp", amp="off"), "train.py")
    (reason,) = [s.reason for s in conversion.log.skipped if s.wrong]
    assert "hold `history.append(out.mean().item())`, a line that assigns nothing," in reason


def test_lines_that_would_swap_their_random_draws_are_refused():
    """Popular-RL-Algorithms' TD3 (the tenth unseen set): written, with the policy's and
    the target policy's noise drawn in the other order. fixtures/dp/swapped_draws.py."""
    name = "swapped_draws.py"
    source = (FIXTURES / name).read_text(encoding="utf-8")
    conversion = convert_source(source, ConvertOptions(target="dp", amp="off"), name)
    (skip,) = [s for s in conversion.log.skipped if s.wrong]
    assert "`next_action = target_policy.evaluate(next_state)` and `new_action =" in skip.reason
    assert "would swap the order of their draws" in skip.reason and skip.line == 30
    drawn_once = source.replace(" + 0.1 * torch.randn_like(mean)", "")
    calm = convert_source(drawn_once, ConvertOptions(target="dp", amp="off"), name)
    assert [s for s in calm.log.skipped if s.wrong] == []


@pytest.mark.parametrize(
    "joined, per_sample",
    [
        ("torch.cat([state, action], 1)", True),
        ("torch.cat([state, action], dim=1)", True),
        ("torch.cat([state, action])", False),
        ("torch.stack([state, action], 0)", False),
    ],
)
def test_a_join_along_a_later_dimension_is_per_sample(joined, per_sample):
    """A critic's `q_net(torch.cat([state, action], 1))` joins each sample's features: it
    was refused as mixing the samples of the batch, like a join along dimension 0."""
    source = (FIXTURES / "swapped_draws.py").read_text(encoding="utf-8")
    source = source.replace(" + 0.1 * torch.randn_like(mean)", "")
    source = source.replace("q = q_net(torch.cat([state, action], 1))", f"q = q_net({joined})")
    conversion = convert_source(source, ConvertOptions(target="dp", amp="off"), "train.py")
    refused = [s.reason for s in conversion.log.skipped if s.wrong]
    assert (refused == []) is per_sample
    assert per_sample or "mixes the samples of the batch" in refused[0]
