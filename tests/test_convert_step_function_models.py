"""A model that a step function and an evaluation function receive as their parameter,
called from a loop elsewhere under another name (pytorch/examples' gcn and gat). Before,
`--to fsdp` put `shard_model(model)` after `evaluate`'s `return` or at the end of
`train_step` and exited 0 (which of the two depended on the objects' hashes); `--to ddp`
refused. The model is now wrapped or sharded where the loop's code builds it, and the
wrapper is handed down. fixtures/ddp/step_receives_model.py proves it by running."""

from __future__ import annotations

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import Conversion, convert_source

SCRIPT = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, x, y):
    with torch.no_grad():
        return nn.functional.mse_loss(model(x), y).item()


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return evaluate(model, x[:4], y[:4]), evaluate(model, x[4:], y[4:])


if __name__ == "__main__":
    net = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    for x, y in loader:
        print(train_step(net, optimizer, x, y))
"""


def convert(script: str, target: str) -> Conversion:
    return convert_source(script, ConvertOptions(target=target, amp="off"), "train.py")


def refusals(conversion: Conversion) -> list[tuple[str, int | None]]:
    return [(item.what, item.line) for item in conversion.log.skipped if item.wrong]


def test_ddp_wraps_the_model_where_it_is_built_and_hands_the_wrapper_down():
    conversion = convert(SCRIPT, "ddp")

    assert refusals(conversion) == []
    converted = conversion.converted
    assert converted.index("ddp_net = DDP(") < converted.index("optimizer = torch.optim.SGD(")
    assert "train_step(ddp_net, optimizer, x, y)" in converted
    # `model` is the wrapper there; `evaluate()` trains nothing: it gets the model itself,
    # for both calls (the second one was refused)
    assert "    return evaluate(unwrapped(model), x[:4], y[:4]), evaluate(\n" in converted
    assert "        unwrapped(model), x[4:], y[4:]\n    )\n" in converted


def test_fsdp_shards_the_model_where_it_is_built():
    conversion = convert(SCRIPT, "fsdp")

    assert refusals(conversion) == []
    converted = conversion.converted
    assert converted.index("shard_model(net)") < converted.index("optimizer = torch.optim.SGD(")
    assert converted.count("shard_model(") == 2  # the helper's definition and the call


def test_two_names_that_may_hold_the_model_are_refused_at_the_loop():
    """`net` or `copy` may be the model the step trains: no single place to wrap it."""
    ambiguous = SCRIPT.replace(
        "    net = nn.Linear(4, 1)\n", "    net = nn.Linear(4, 1)\n    copy = net\n"
    ).replace("train_step(net,", "train_step(copy if x.sum() > 0 else net,")
    loop = ambiguous.splitlines().index("    for x, y in loader:") + 1

    for target, step in (("ddp", "DistributedDataParallel"), ("fsdp", "fully_shard")):
        assert refusals(convert(ambiguous, target)) == [(step, loop)]


GRADIENT_PENALTY = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def gradient_penalty(D, x):
    x = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(D(x).sum(), x, create_graph=True)
    return (grad.norm(dim=1) - 1).pow(2).mean()


D_A, D_B = nn.Linear(4, 1), nn.Linear(4, 1)
opt_A = torch.optim.SGD(D_A.parameters(), lr=0.1)
opt_B = torch.optim.SGD(D_B.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 4)), batch_size=8)
for a, b in loader:
    opt_A.zero_grad()
    loss_A = -D_A(a).mean() + gradient_penalty(D_A, a)
    loss_A.backward()
    opt_A.step()
    opt_B.zero_grad()
    loss_B = -D_B(b).mean() + gradient_penalty(D_B, b)
    loss_B.backward()
    opt_B.step()
"""


def test_a_helper_given_either_model_keeps_the_bare_one_beside_a_wrapper_forward():
    """PyTorch-GAN's dualgan: `compute_gradient_penalty(D, ...)` is given `D_A` and `D_B`,
    so no one wrapper reaches it; its gradients join those of `ddp_D_A(a)` in one
    backward, which DDP averages, so it stays on the bare model."""
    conversion = convert(GRADIENT_PENALTY, "ddp")

    assert refusals(conversion) == []
    converted = conversion.converted
    assert "loss_A = -ddp_D_A(a).mean() + gradient_penalty(D_A, a)" in converted
    assert "loss_B = -ddp_D_B(b).mean() + gradient_penalty(D_B, b)" in converted


def test_a_model_called_only_through_an_unroutable_helper_is_refused():
    """Without a forward through the wrapper, DDP would average nothing."""
    only_helper = GRADIENT_PENALTY.replace("-D_A(a).mean() + ", "").replace("-D_B(b).mean() + ", "")

    conversion = convert(only_helper, "ddp")

    assert [what for what, _ in refusals(conversion)] == ["DistributedDataParallel"]
    assert "DDP(" not in conversion.converted


FACTORY = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def set_model():
    model = nn.Linear(4, 1)
    criterion = nn.MSELoss()
    if torch.cuda.is_available():
        model = model.cuda()
    return model, criterion


def train(loader, model, criterion, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()


def main():
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    model, criterion = set_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        train(loader, model, criterion, optimizer)


main()
"""


@pytest.mark.parametrize(
    "returned, bound",
    [("model, criterion", "model, criterion = set_model()"), ("model", "model = set_model()")],
)
def test_a_model_a_factory_returns_is_wrapped_where_the_caller_holds_it(returned, bound):
    """SupContrast's `set_model()`: its `model` is gone once it returns, so the wrapper
    is built in `main()` and handed to `train()` (before, it was planned in the factory,
    no call reached it, and the conversion was refused)."""
    script = FACTORY.replace("return model, criterion", f"return {returned}").replace(
        "model, criterion = set_model()",
        bound + ("\n    criterion = nn.MSELoss()" if returned == "model" else ""),
    )

    ddp, fsdp = convert(script, "ddp"), convert(script, "fsdp")

    assert refusals(ddp) == [] and refusals(fsdp) == []
    main = ddp.converted[ddp.converted.index("def main():") :]
    assert main.index(bound) < main.index("ddp_model = DDP(") < main.index("optimizer = ")
    assert "train(loader, ddp_model, criterion, optimizer)" in main
    fsdp_main = fsdp.converted[fsdp.converted.index("def main():") :]
    assert (
        fsdp_main.index(bound)
        < fsdp_main.index("shard_model(model)")
        < fsdp_main.index("optimizer = ")
    )


def test_a_function_that_trains_then_returns_the_model_is_no_factory():
    """LLMs-from-scratch's `main()` trains, then returns the model to the module, which
    saves it: the wrapper stays in `main()`, where the training is (the module-level
    name, bound after training, cannot be)."""
    script = FACTORY.replace(
        "        train(loader, model, criterion, optimizer)\n",
        "        train(loader, model, criterion, optimizer)\n    return model\n",
    ).replace("\nmain()\n", "\nmodel = main()\ntorch.save(model.state_dict(), 'model.pth')\n")

    conversion = convert(script, "ddp")

    assert refusals(conversion) == []
    assert "train(loader, ddp_model, criterion, optimizer)" in conversion.converted
