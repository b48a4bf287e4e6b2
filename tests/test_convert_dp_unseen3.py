"""`--to dp` on shapes of the unseen-code measurement whose refusals gave false reasons
(bench30, issue 30): `torch.rand(x.size(0), 1)` between two forward lines was taken to
change `torch` (and `x`) in place; a loss backpropagated in the branches of `if use_amp:`
was "not computed in the lines before `.backward()`"; a step whose lines the mixed
precision rewrite put under `torch.autocast` was "computed in a `with` block", and the
loss that truly forbids splitting it (an online triplet loss, pairing samples across the
batch) was not named; a replay memory passed to an agent's step method "looked like a
recurrent state" by its name alone. A line feeding the forward pass that changed one of
its inputs in place after a line reading it ran before them all, unrefused."""

from __future__ import annotations

from pathlib import Path

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
DP = ConvertOptions(target="dp", amp="off")
BY_HAND = "; by hand: compute the loss in the `forward` of an `nn.Module`"


def convert(name: str, options: ConvertOptions = DP, replace: tuple[str, str] = ("", "")):
    source = (FIXTURES / name).read_text(encoding="utf-8").replace(*replace)
    return convert_source(source, options, name)


def refusals(conversion) -> list[tuple[int, str]]:
    return [(s.line, s.reason.split(BY_HAND)[0]) for s in conversion.log.skipped if s.wrong]


def test_a_module_and_a_size_read_between_forward_lines_change_nothing() -> None:
    conversion = convert("critic_penalty.py")
    assert (
        "def compute_loss(critic, real, fake, mixed):\n"
        "    # runs on each GPU's part of the batch\n"
        "    real_loss = -torch.mean(critic(real))\n"
        "    fake_loss = torch.mean(critic(fake))\n"
        "    mixed_loss = torch.mean(critic(mixed) ** 2)\n" in conversion.converted
    )
    assert (
        "        alpha = torch.rand(real.size(0), 1).to(device)\n"
        "        mixed = alpha * real + (1 - alpha) * fake\n"
        "        loss = loss_on_gpus(real, fake, mixed).mean()" in conversion.converted
    )
    assert refusals(conversion) == []


def test_an_in_place_change_between_forward_lines_is_still_refused() -> None:
    conversion = convert(
        "critic_penalty.py",
        replace=("alpha = torch.rand(real.size(0), 1)", "alpha = real.clamp_(-1, 1)"),
    )
    assert refusals(conversion) == [
        (
            21,
            "`real` is changed in place between two lines of the forward pass, after one that"
            " reads it",
        )
    ]


def test_a_loss_backpropagated_in_the_branches_of_an_if_converts() -> None:
    conversion = convert("amp_branch_backward.py")
    assert (
        "        loss = loss_on_gpus(x, y).mean()  # mean of the per-GPU losses\n"
        "        if (i + 1) % 4 == 0:\n" in conversion.converted
    )
    assert "            scaler.scale(loss).backward()\n" in conversion.converted
    assert "    pred = model(x).squeeze(-1)\n    loss = criterion(pred, y)\n" in (
        conversion.converted
    )
    assert refusals(conversion) == []


def test_a_forward_pass_in_a_helper_is_named_once_for_both_branches() -> None:
    conversion = convert(
        "amp_branch_backward.py",
        replace=(
            "        pred = model(x).squeeze(-1)\n",
            "        pred = predict(x)\n",
        ),
    )
    assert refusals(conversion) == [
        (
            28,
            "`predict(...)` computes `loss`, but the code does not show it to be a model: a"
            " helper computing the forward pass, or a model whose class is not visible where"
            " it is made",
        )
    ]


def test_an_online_triplet_loss_is_refused_for_pairing_samples_across_the_batch() -> None:
    reason = (
        "`loss_fn(...)` pairs samples across the batch (`OnlineTripletLoss.forward` indexes"
        " `embeddings` with `triplets`, computed from the batch): on each GPU it would pair"
        " only those of its part of the batch, so `nn.DataParallel` would change the loss"
    )
    assert refusals(convert("triplet_mining.py")) == [(45, reason)]
    # under the mixed precision rewrite's `with torch.autocast(...)` too: no `with` block named
    assert refusals(convert("triplet_mining.py", ConvertOptions(target="dp"))) == [(45, reason)]


def test_a_loss_taking_pairwise_distances_is_refused() -> None:
    conversion = convert(
        "triplet_mining.py",
        replace=(
            "triplets = hardest_triplets(embeddings, labels)",
            "triplets = torch.cdist(embeddings, embeddings).argmin(1)",
        ),
    )
    assert [r for _, r in refusals(conversion)] == [
        "`loss_fn(...)` pairs samples across the batch (`OnlineTripletLoss.forward` takes"
        " pairwise distances with `torch.cdist`): on each GPU it would pair only those of its"
        " part of the batch, so `nn.DataParallel` would change the loss"
    ]


def test_an_if_in_the_autocast_block_is_named_not_the_block() -> None:
    conversion = convert(
        "triplet_mining.py",
        ConvertOptions(target="dp"),
        replace=(
            "loss = loss_fn(embeddings, labels)",
            "loss = F.cross_entropy(embeddings, labels)",
        ),
    )
    assert refusals(conversion) == [
        (
            43,
            "the lines from the forward pass to `loss` hold an `if` block, which cannot move"
            " into a function with them",
        )
    ]


def test_a_replay_memory_passed_to_the_step_method_is_no_recurrent_state() -> None:
    conversion = convert("replay_agent.py")
    assert (
        "        self.loss_on_gpus = LossInForward(compute_loss, self.value)\n"
        in conversion.converted
    )
    assert (
        "        states, rewards = memory.sample(batch_size)\n"
        "        states, rewards = states.to(device), rewards.to(device).unsqueeze(1)\n"
        "        loss = self.loss_on_gpus(states, rewards).mean()" in conversion.converted
    )
    assert conversion.log.skipped == []


def test_a_state_the_step_method_feeds_its_model_is_still_refused() -> None:
    source = (FIXTURES / "replay_agent.py").read_text(encoding="utf-8")
    source = source.replace(
        "update(self, memory, batch_size)", "update(self, memory, batch_size, hidden)"
    )
    source = source.replace("self.value(states)", "self.value(states + hidden)")
    conversion = convert_source(source, DP, "replay_agent.py")
    assert (
        31,
        "`hidden` looks like a recurrent state: `nn.DataParallel` would split it along"
        " dimension 0",
    ) in refusals(conversion)


def test_distances_to_the_models_own_centres_pair_no_samples() -> None:
    conversion = convert(
        "triplet_mining.py",
        replace=(
            "triplets = hardest_triplets(embeddings, labels)",
            "triplets = torch.cdist(embeddings, self.centres).argmin(1)",
        ),
    )
    assert not [r for _, r in refusals(conversion) if "pairs samples" in r]
