"""`convert --to ddp|fsdp` of a model trained through a method other than `forward()`: a
PPO agent's `self.net.evaluate(obs, actions)` (fixtures/ddp/method_trained_agent.py).
DDP averages gradients only for a forward() called through its wrapper, so `--to ddp`
wraps a `MethodAsForward` module that runs the method as its forward(), and the training
call goes to that wrapper; `--to fsdp` registers the method as a forward method of the
sharded model. Both ranks' parameters are checked in
tests/test_convert_method_forward_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "method_trained_agent.py"
DDP = ConvertOptions(target="ddp", amp="off")
FSDP = ConvertOptions(target="fsdp", amp="off")
WRAPPED = """\
        self.net = ActorCritic()
        # `evaluate()` trains `self.net`: when distributed, a DDP wrapper runs it as its
        # forward(), which averages the gradients in backward()
        self.ddp_net_evaluate = self.net.evaluate
        if DISTRIBUTED:
            self.ddp_net_evaluate = DDP(
                MethodAsForward(self.net, "evaluate"),
                device_ids=(
                    [LOCAL_RANK] if next(self.net.parameters()).is_cuda else None
                ),
            )
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=0.01)
"""


def convert(options=DDP, source: str | None = None):
    source = FIXTURE.read_text(encoding="utf-8") if source is None else source
    return convert_source(source, options, str(FIXTURE))


def wrong(conversion) -> list:
    return [s for s in conversion.log.skipped if s.wrong]


def test_ddp_runs_the_training_method_as_the_forward_of_a_wrapper():
    """Before: "no trained model was recognised in this training loop" (line 33)."""
    conversion = convert()
    code = conversion.converted
    assert wrong(conversion) == []
    assert WRAPPED in code
    assert "            log_probs, values, entropy = self.ddp_net_evaluate(obs, actions)\n" in code
    assert code.count("class MethodAsForward(torch.nn.Module):") == 1
    assert "        return getattr(self.module, self.method)(*args, **kwargs)\n" in code
    assert "find_unused_parameters" not in code  # evaluate() uses every layer


def test_ddp_leaves_the_bare_model_to_everything_else():
    """The copy into the acting network and the rollouts under `no_grad` use the model
    itself: its state dict keys, no wrapper, no communication."""
    code = convert().converted
    assert code.count("self.old_net.load_state_dict(self.net.state_dict())") == 2
    assert "        actions, log_probs = agent.old_net.act(obs)\n" in code


def test_ddp_logs_the_method_wrapper_and_the_rerouted_call():
    changes = {(c.line, c.description) for c in convert().log.changes}
    assert (
        35,
        "`self.ddp_net_evaluate`: `self.net.evaluate()`, which trains `self.net`, run as the"
        " forward() of a DistributedDataParallel wrapper (gradients averaged over processes);"
        " `self.net` stays the bare model",
    ) in changes
    assert (44, "training forward pass through `self.ddp_net_evaluate`") in changes


def test_ddp_finds_unused_parameters_when_the_method_leaves_a_layer_out():
    """A layer only `act()` uses gets no gradient from `evaluate()`: DDP would wait for it
    and fail at the next step, unless told."""
    source = (
        FIXTURE.read_text(encoding="utf-8")
        .replace(
            "        self.critic = nn.Linear(16, 1)\n",
            "        self.critic = nn.Linear(16, 1)\n        self.explore = nn.Linear(16, n_actions)\n",
        )
        .replace("logits=self.actor(self.body(obs))", "logits=self.explore(self.body(obs))")
    )
    code = convert(source=source).converted
    assert (
        "        # (it leaves out the parameters of `explore`: DDP must not wait for their gradients)\n"
    ) in code
    assert "            find_unused_parameters=True,\n" in code


def test_ddp_routes_only_the_call_that_trains():
    """A baseline computed under `torch.no_grad()` in the step trains nothing: it stays
    on the bare model."""
    source = FIXTURE.read_text(encoding="utf-8").replace(
        "            advantages = rewards - values.detach()\n",
        "            with torch.no_grad():\n"
        "                _, baseline, _ = self.net.evaluate(obs, actions)\n"
        "            advantages = rewards - baseline\n",
    )
    conversion = convert(source=source)
    assert wrong(conversion) == []
    assert (
        "log_probs, values, entropy = self.ddp_net_evaluate(obs, actions)" in conversion.converted
    )
    assert "_, baseline, _ = self.net.evaluate(obs, actions)" in conversion.converted


def test_ddp_refuses_a_model_trained_through_two_methods_at_the_second():
    """Two DDP wrappers of one model would each average its gradients."""
    source = (
        FIXTURE.read_text(encoding="utf-8")
        .replace(
            "            advantages = rewards - values.detach()\n",
            "            advantages = rewards - values.detach()\n"
            "            values = self.net.value(obs)\n",
        )
        .replace(
            "    def forward(self):\n",
            "    def value(self, obs):\n        return self.critic(self.body(obs)).squeeze(-1)\n\n"
            "    def forward(self):\n",
        )
    )
    conversion = convert(source=source)
    (refusal,) = wrong(conversion)
    assert refusal.line == 49
    assert refusal.reason.startswith(
        "`self.net` trains through `evaluate()` and `value()`: a DDP wrapper runs one method"
        " as its forward(), and two wrappers of one model would each average its gradients,"
        " so `self.net` is not wrapped"
    )
    assert "DDP(" not in conversion.converted


def test_fsdp_registers_the_training_method_after_sharding():
    """Before: "no trained model was recognised in this training loop"."""
    conversion = convert(FSDP)
    assert wrong(conversion) == []
    assert (
        "        if DISTRIBUTED:\n"
        "            shard_model(self.net)\n"
        "            # evaluate() gathers the parameters too, as forward() does\n"
        '            register_fsdp_forward_method(self.net, "evaluate")\n'
        "        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=0.01)\n"
    ) in conversion.converted
    assert "MethodAsForward" not in conversion.converted
    assert "log_probs, values, entropy = self.net.evaluate(obs, actions)" in conversion.converted


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_without_an_optimizer_of_the_model_nothing_is_routed(options):
    """A method call of a model no optimizer trains is not a training forward pass."""
    source = FIXTURE.read_text(encoding="utf-8").replace(
        "torch.optim.Adam(self.net.parameters(), lr=0.01)",
        "torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=0.01)",
    )
    code = convert(options, source).converted
    assert "MethodAsForward" not in code and "register_fsdp_forward_method" not in code


def test_fsdp_registers_a_method_called_under_another_name_too():
    """`agent.net.act(obs)` at top level computes with the sharded layers: registered
    after the training method (before, only calls under the model's own name counted)."""
    source = FIXTURE.read_text(encoding="utf-8").replace(
        "agent.old_net.act(obs)", "agent.net.act(obs)"
    )
    code = convert(FSDP, source).converted
    assert (
        "            # evaluate() and act() gather the parameters too, as forward() does\n"
        '            register_fsdp_forward_method(self.net, "evaluate")\n'
        '            register_fsdp_forward_method(self.net, "act")\n'
    ) in code


SAMPLES_EVERY_EPOCH = """\
import torch
import torch.nn as nn


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 2)
        self.decoder = nn.Linear(2, 4)

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def inference(self, z):
        return self.decoder(z)


vae = VAE()
optimizer = torch.optim.SGD(vae.parameters(), lr=0.1)
data = torch.randn(64, 4)
for epoch in range(2):
    for i in range(0, 64, 8):
        x = data[i : i + 8]
        loss = ((vae(x) - x) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    samples = vae.inference(torch.randn(4, 2))
"""


def test_a_model_trained_through_forward_keeps_its_other_methods_on_the_bare_model():
    """VAE-CVAE draws samples with `vae.inference(z)` in the epoch loop, outside
    `no_grad()`. Converting the result again took the wrapped forward for no training
    call at all and routed `inference()` through a second DDP wrapper: "a step is not
    idempotent", nothing written."""
    conversion = convert(DDP, SAMPLES_EVERY_EPOCH)
    assert "samples = vae.inference(torch.randn(4, 2))" in conversion.converted
    assert "MethodAsForward" not in conversion.converted
    assert convert(DDP, conversion.converted).converted == conversion.converted
