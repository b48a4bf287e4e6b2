"""`convert --to fsdp`, one test per behaviour, on small scripts; and the fixtures of
fixtures/fsdp/ against their snapshots (tests/snapshots/fsdp/, regenerated with
AUTOACCEL_UPDATE_SNAPSHOTS=1). tests/test_convert_fsdp_runs.py runs them."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import Conversion, convert_source
from autoaccel.convert.transforms.distributed import DDP_STEPS, GuardRankZero, WrapModel
from autoaccel.convert.transforms.fully_sharded import FSDP_STEPS, ShardModel

FSDP = ConvertOptions(target="fsdp", amp="off")
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fsdp"
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "fsdp"
UPDATE = os.environ.get("AUTOACCEL_UPDATE_SNAPSHOTS") == "1"

TRAIN = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def main():
    loader = DataLoader(torch.randn(64, 4), batch_size=8)
{build}
    for epoch in range(2):
        for x in loader:
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
{after}

main()
"""


def convert(build: str, after: str = "", options: ConvertOptions = FSDP) -> Conversion:
    """TRAIN with `build` (the model and optimizer) and `after` (code after training),
    both given at the indentation of main()'s body, converted."""
    source = TRAIN.format(
        build=textwrap.indent(textwrap.dedent(build), "    "),
        after=textwrap.indent(textwrap.dedent(after), "    "),
    )
    return convert_source(source, options, "train.py")


def body_of_main(conversion: Conversion) -> str:
    text = conversion.converted
    return text[text.index("def main():") :]


def refusals(conversion: Conversion) -> list[str]:
    return [item.reason for item in conversion.log.skipped if item.wrong]


def test_fsdp_steps_replace_ddp_wrapping_and_keep_the_rest():
    assert ShardModel in FSDP_STEPS and WrapModel not in FSDP_STEPS
    kept = [step for step in DDP_STEPS if step in FSDP_STEPS]
    assert kept == [step for step in FSDP_STEPS if step in DDP_STEPS]  # same order
    assert GuardRankZero not in FSDP_STEPS  # its subclass that keeps gathering functions


def test_shards_after_the_model_is_on_its_device():
    conversion = convert("""\
        model = Net().to("cpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """)
    main = body_of_main(conversion)
    assert 'model = Net().to("cpu")\n' in main
    assert main.index("shard_model(model)") < main.index("optimizer = torch.optim.SGD")
    assert "    if DISTRIBUTED:\n        shard_model(model)\n" in main
    assert "fully_shard(block, **policies)" in conversion.converted
    assert not refusals(conversion)


def test_two_models_share_one_helper():
    source = textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(torch.randn(64, 4), batch_size=8)
        encoder = torch.nn.Linear(4, 4)
        decoder = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD([*encoder.parameters(), *decoder.parameters()], lr=0.1)
        for x in loader:
            loss = (decoder(encoder(x)) - x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """)
    converted = convert_source(source, FSDP, "train.py").converted
    assert converted.count("def shard_model(") == 1
    assert "shard_model(encoder)" in converted and "shard_model(decoder)" in converted


def test_moves_an_optimizer_built_before_the_model_moves():
    conversion = convert("""\
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.to("cpu")
        """)
    main = body_of_main(conversion)
    assert (
        main.index('model.to("cpu")') < main.index("shard_model(model)") < main.index("optimizer =")
    )
    assert main.count("optimizer = torch.optim.SGD") == 1


def test_moves_an_optimizer_a_method_of_the_model_builds():
    """minGPT's `model.configure_optimizers(config)`: left before fully_shard, the
    optimizer held the unsharded tensors and the model never trained."""
    source = TRAIN.replace(
        "        return x\n",
        "        return x\n\n    def configure_optimizers(self, lr):\n"
        "        return torch.optim.AdamW(self.parameters(), lr=lr)\n",
    ).format(
        build='    model = Net()\n    optimizer = model.configure_optimizers(0.1)\n    model.to("cpu")',
        after="",
    )
    main = body_of_main(convert_source(source, FSDP, "train.py"))
    assert main.index("shard_model(model)") < main.index(
        "optimizer = model.configure_optimizers(0.1)"
    )


def test_shards_before_an_optimizer_that_only_a_state_load_follows():
    conversion = convert("""\
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        state = torch.load("ckpt.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        """)
    main = body_of_main(conversion)
    assert main.index("shard_model(model)") < main.index("optimizer = torch.optim.SGD")
    assert 'load_full_state_dict(model, state["model"])' in main
    assert 'load_full_optimizer_state_dict(model, optimizer, state["optimizer"])' in main
    assert "broadcast_from_rank0=True" in conversion.converted


def test_refuses_an_optimizer_used_before_the_model_is_ready():
    conversion = convert("""\
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        model.to("cpu")
        """)
    (reason,) = refusals(conversion)
    assert "uses the optimizer of `model`" in reason
    assert '(`model.to("cpu")` still changes the model after the optimizer is built' in reason


def test_gathers_the_state_dict_on_every_rank_and_saves_on_rank_zero():
    conversion = convert(
        """\
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """,
        'torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "c.pt")\n',
    )
    main = body_of_main(conversion)
    assert (
        "    model_state = full_state_dict(model)\n"
        "    optimizer_state = full_optimizer_state_dict(model, optimizer)\n"
        "    if RANK == 0:\n"
        '        torch.save({"model": model_state, "optimizer": optimizer_state}, "c.pt")\n'
    ) in main
    assert "full_state_dict=True, cpu_offload=True" in conversion.converted


def test_a_checkpoint_function_keeps_running_on_every_rank():
    """Its parameters receive the sharded model and its optimizer under other names."""
    source = TRAIN.format(
        build="    model = Net()\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        after="    save(model, optimizer)\n",
    ).replace(
        "def main():",
        "def save(net, optim):\n"
        '    torch.save({"net": net.state_dict(), "optim": optim.state_dict()}, "m.pt")\n\n\n'
        "def main():",
    )
    converted = convert_source(source, FSDP, "train.py").converted
    assert (
        "def save(net, optim):\n"
        "    net_state = full_state_dict(net)\n"
        "    optim_state = full_optimizer_state_dict(net, optim)\n"
        "    if RANK == 0:\n"
        '        torch.save({"net": net_state, "optim": optim_state}, "m.pt")\n'
    ) in converted
    assert "return  # only rank 0 writes" not in converted


@pytest.mark.parametrize(
    "after, reason",
    [
        pytest.param(
            "print(model.layers[0].weight.data.norm())\n", "(`.data`)", id="attribute-data"
        ),
        pytest.param(
            "for p in model.parameters():\n    p.data.clamp_(-1, 1)\n", "(`.data`)", id="loop-data"
        ),
        pytest.param(
            'torch.save(model, "model.pt")\n', "pickles the whole `model`", id="pickled-model"
        ),
        pytest.param(
            "def show(net):\n    for p in net.parameters():\n        print(p.data.norm())\n\n"
            "show(model)\n",
            "(`.data`)",
            id="data-under-another-name",
        ),
        pytest.param(
            'def export(net):\n    torch.save(net, "model.pt")\n\nexport(model)\n',
            "pickles the whole `model`",
            id="pickled-under-another-name",
        ),
        pytest.param(
            "if torch.distributed.get_rank() == 0:\n    print(model(torch.randn(1, 4)))\n",
            "on some processes only",
            id="forward-under-a-rank-test",
        ),
    ],
)
def test_refuses_what_sharding_would_break(after, reason):
    conversion = convert(
        "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n", after
    )
    assert any(reason in found for found in refusals(conversion)), conversion.log.skipped


def test_a_print_of_a_forward_pass_computes_it_on_every_rank_first():
    conversion = convert(
        "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        'print(f"norm {model(torch.ones(1, 4)).norm():.3f}")\nprint(model)\n',
    )
    main = body_of_main(conversion)
    assert (
        "    model_result = model(torch.ones(1, 4))\n"
        "    if RANK == 0:\n"
        '        print(f"norm {model_result.norm():.3f}")\n'
        "        print(model)\n"
    ) in main
    assert not refusals(conversion)


def test_bf16_uses_a_mixed_precision_policy_on_gpus_instead_of_autocast():
    conversion = convert(
        "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        options=ConvertOptions(target="fsdp", amp="bf16"),
    )
    assert (
        "    if any(parameter.is_cuda for parameter in model.parameters()):\n"
        "        # bf16 compute, fp32 gradient averaging\n" in conversion.converted
    )
    assert "param_dtype=torch.bfloat16, reduce_dtype=torch.float32" in conversion.converted
    # the whole model's outputs back in fp32 (ninth unseen set: `.numpy()` of an output)
    assert (
        '        policies["mp_policy"] = MixedPrecisionPolicy(\n'
        "            param_dtype=torch.bfloat16,\n"
        "            reduce_dtype=torch.float32,\n"
        "            output_dtype=torch.float32,\n"
        "        )\n"
        "    fully_shard(model, **policies)\n"
    ) in conversion.converted
    assert "autocast" not in conversion.converted
    assert (
        "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n"
        in conversion.converted
    )


def test_amp_off_keeps_fp32_and_cpu_offload_is_opt_in():
    build = "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    plain = convert(build).converted
    assert "MixedPrecisionPolicy" not in plain and "CPUOffloadPolicy" not in plain
    offloaded = convert(
        build, options=ConvertOptions(target="fsdp", amp="off", cpu_offload=True)
    ).converted
    assert 'policies["offload_policy"] = CPUOffloadPolicy()' in offloaded


@pytest.mark.parametrize(
    "options, message",
    [
        pytest.param(("--to", "fsdp", "--amp", "fp16"), "use --amp bf16 or off", id="fp16"),
        pytest.param(
            ("--to", "ddp", "--cpu-offload"),
            "--cpu-offload shards with --to fsdp only",
            id="offload-ddp",
        ),
    ],
)
def test_cli_rejects_options_fsdp_cannot_honour(cli, tmp_path, options, message):
    (tmp_path / "train.py").write_text("import torch\n")
    run = cli("convert", "train.py", *options)
    assert run.exit_code == 2
    assert message in run.stderr


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.py")))
def test_fixture_matches_snapshot(name):
    converted = convert_source((FIXTURES / name).read_text(), FSDP, name).converted
    snapshot = SNAPSHOTS / name
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        snapshot.write_text(converted)
    assert converted == snapshot.read_text()


def test_cli_refuses_with_the_line_and_writes_nothing(cli, tmp_path):
    script = TRAIN.format(
        build="    model = Net()\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        after="    print(model.layers[0].weight.data.norm())\n",
    )
    (tmp_path / "train.py").write_text(script)
    line = script.splitlines().index("    print(model.layers[0].weight.data.norm())") + 1
    run = cli("convert", "train.py", "--to", "fsdp", "-o", "out.py")
    assert run.exit_code == 1
    assert f"train.py:{line}:1: error: fully_shard not applied" in run.stderr
    assert "--to fsdp refused" in run.stderr
    assert not (tmp_path / "out.py").exists()


@pytest.mark.parametrize("name", ["horovod_mnist.py", "apex_parallel.py", "launch_local_rank.py"])
def test_legacy_distributed_scripts_are_migrated_by_ddp_only(name):
    """Horovod and launch-style migrations are --to ddp's: under fsdp the script's own
    distributed set-up is refused, not half-migrated."""
    source = (FIXTURES.parent / "legacy_distributed" / name).read_text()
    conversion = convert_source(source, FSDP, name)
    found = refusals(conversion)
    assert any(
        "already sets up torch.distributed" in r or "does not migrate Horovod" in r for r in found
    ), found


def test_sharded_models_are_freed_before_the_process_group():
    """Freed at exit, after the process group, FSDP's state aborted 2 of 8 CPU runs of
    clip_resume.py (exit -6, "terminate called without an active exception"); with a
    collection first, 0 of 14."""
    conversion = convert("model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    text = conversion.converted
    assert "import gc\n" in text
    assert text.index("gc.collect()") < text.index("dist.destroy_process_group()")


MODULE_LEVEL = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=32)
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    optimizer.step()
"""


def test_module_level_sharded_model_and_optimizer_are_deleted_before_the_process_group():
    """A collection does not free what module-level names still hold: an FSDP2 model
    evaluated after training aborted 6 of 16 runs, 0 of 30 with the model and its
    optimizer deleted, then collected, first."""
    text = convert_source(MODULE_LEVEL, FSDP, "train.py").converted
    assert text.endswith(
        "    del model, optimizer\n    gc.collect()\n    dist.destroy_process_group()\n"
    )


def test_an_instance_holding_the_sharded_model_is_deleted_before_the_process_group():
    """`exp.train()` shards `self.model`: `exp` holds it, and `model` (what `train()`
    returns) is it; both go first (the model the script built, never given to the
    optimizer, `plain`, stays)."""
    source = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class Exp:
    def __init__(self):
        self.model = nn.Linear(4, 2)

    def train(self):
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        for x, y in DataLoader(dataset, batch_size=32):
            optimizer.zero_grad()
            ((self.model(x) - y) ** 2).mean().backward()
            optimizer.step()
        return self.model


plain = nn.Linear(4, 2)
exp = Exp()
model = exp.train()
"""
    text = convert_source(source, FSDP, "train.py").converted
    assert "shard_model(self.model)" in text
    assert text.endswith("    del exp, model\n    gc.collect()\n    dist.destroy_process_group()\n")


def test_a_model_the_script_deletes_itself_is_not_deleted_again():
    """`del model` of the script's own, at the end: a second `del` would raise NameError."""
    text = convert_source(MODULE_LEVEL + "del model\n", FSDP, "train.py").converted
    assert text.endswith("    del optimizer\n    gc.collect()\n    dist.destroy_process_group()\n")


def test_a_function_that_runs_the_sharded_model_to_write_runs_on_every_rank():
    """PyTorch-GAN's `sample_image()`: the generator's forward pass needs every process,
    so only the save goes under the rank test (it was refused as rank-0-only compute;
    `fixtures/ddp/gan_samples.py` passes `--to fsdp --verify` this way)."""
    source = MODULE_LEVEL.replace(
        "for x, y in loader:\n",
        "def sample(step):\n"
        "    out = model(torch.ones(1, 4))\n"
        '    torch.save(out.detach(), "sample_%d.pt" % step)\n\n\n'
        "for step, (x, y) in enumerate(loader):\n",
    ).replace("    optimizer.step()\n", "    optimizer.step()\n    sample(step)\n")
    conversion = convert_source(source, FSDP, "train.py")

    assert refusals(conversion) == []
    assert (
        "def sample(step):\n"
        "    out = model(torch.ones(1, 4))\n"
        "    if RANK == 0:\n"
        '        torch.save(out.detach(), "sample_%d.pt" % step)\n'
    ) in conversion.converted


def test_a_state_dict_loaded_from_another_sharded_model_is_gathered_then_loaded():
    # A target network refreshed from the trained one (DQN): both are sharded, so the
    # state dict is gathered into a statement of its own and that is what is loaded.
    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader

        loader = DataLoader(torch.randn(64, 4), batch_size=8)
        model, target = nn.Linear(4, 4), nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, x in enumerate(loader):
            if step % 4 == 0:
                target.load_state_dict(model.state_dict())
            loss = (model(x) - target(x).detach()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """)
    converted = convert_source(source, FSDP, "train.py").converted
    # built in one statement, sharded in one block
    assert "if DISTRIBUTED:\n    shard_model(model)\n    shard_model(target)\n" in converted
    assert (
        "        model_state = full_state_dict(model)\n"
        "        load_full_state_dict(target, model_state)\n"
    ) in converted


DECIDED = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), batch_size=8, shuffle=True)
best_acc = 0.0
for epoch in range(4):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
    acc = correct / 64
    if acc > best_acc:
        best_acc = acc
        torch.save(model.state_dict(), "best.pt")
    if epoch % 2 == 0:
        torch.save(model.state_dict(), f"epoch{epoch}.pt")
"""


def test_a_gathering_under_a_compared_result_goes_where_rank_zero_decides():
    """The RepDistiller teacher gathers its checkpoint in `if test_acc > best_acc:`; under
    FSDP BatchNorm's running statistics stay per process, so the processes' accuracies may
    differ and one would wait forever in the gathering. A counter's test is the same
    everywhere: left as it is."""
    conversion = convert_source(DECIDED, FSDP, "train.py")
    assert (
        "    if first_process_decides(acc > best_acc):\n        best_acc = acc\n"
        in conversion.converted
    )
    assert "    if epoch % 2 == 0:\n" in conversion.converted
    assert "    dist.broadcast(flag, src=0)\n" in conversion.converted
    assert convert_source(conversion.converted, FSDP, "train.py").converted == conversion.converted


def test_a_model_returning_distributions_is_refused_under_fsdp_only():
    """Ninth unseen set F4 (pytorch-vae): the proof saw the sharded parameters never change
    and guessed "an optimizer built before the model was sharded"; the cause is the
    forward, which returns no tensor for FSDP's hooks. `--to ddp` converts it."""
    source = (FIXTURES / "distribution_output" / "train.py").read_text(encoding="utf-8")
    (refusal,) = [s for s in convert_source(source, FSDP, "vae.py").log.skipped if s.wrong]
    assert refusal.line == 28  # `model = VAE()`
    assert refusal.reason.startswith(
        "`VAE.forward` returns `Normal(self.decoder(posterior.rsample()), 1.0)`, a distribution"
        " and no tensor"
    )
    ddp = convert_source(source, ConvertOptions(target="ddp", amp="off"), "vae.py")
    assert not [s for s in ddp.log.skipped if s.wrong]


def test_distributions_made_by_modules_the_model_is_given_are_refused_too():
    """pytorch-vae itself (the ninth set's re-run): `self.encoder = encoder`, and forward
    returns what `self.decoder(...)` returns; the check looked one call deep only."""
    source = (FIXTURES / "distribution_output" / "given_modules.py").read_text(encoding="utf-8")
    (refusal,) = [s for s in convert_source(source, FSDP, "vae.py").log.skipped if s.wrong]
    assert refusal.reason.startswith("`VAE.forward` returns `Normal(self.net(z), 1.0)`")


def test_a_function_defined_before_the_model_stays_where_it_is():
    """`def count_parameters(model)` reads `model.parameters()` but builds no optimizer:
    it moved below the sharding, after its first call (hyunwoongko/transformer, the tenth
    unseen set: a NameError, caught by the proof)."""
    conversion = convert("""\
        def count_parameters(model):
            return sum(p.numel() for p in model.parameters())

        model = Net()
        print(count_parameters(model))
        model.apply(lambda m: None)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """)
    main = body_of_main(conversion)
    assert main.index("def count_parameters(") < main.index("model = Net()")
    assert main.index("shard_model(model)") < main.index("optimizer = torch.optim.SGD(")
    assert refusals(conversion) == []


GLOBAL_STATE = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


def train(epoch):
    for x in loader:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pt")


loader = DataLoader(torch.randn(64, 4), batch_size=8)
model = nn.Linear(4, 4)
if True:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
else:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
for epoch in range(2):
    train(epoch)
"""


def test_a_function_saving_the_global_optimizer_of_the_global_model_gathers_both():
    """pytorch-speech-commands (the tenth unseen set): `train(epoch)` saves the module's
    `optimizer`, built in one of two branches, of the module's only sharded `model`
    ("which sharded model `optimizer` optimizes is not known here")."""
    conversion = convert_source(GLOBAL_STATE, FSDP, "train.py")
    assert refusals(conversion) == []
    assert "full_optimizer_state_dict(model, optimizer)" in conversion.converted


def test_each_optimizer_s_state_is_gathered_with_the_model_it_trains():
    """Twelfth unseen set (a DCGAN): two sharded models, two optimizers saved in one dict."""
    conversion = unrefused_fixture("gan_checkpoint.py")
    for model, optimizer in (("netG", "optimizerG"), ("netD", "optimizerD")):
        assert (
            f"{optimizer}_state = full_optimizer_state_dict({model}, {optimizer})\n"
            in conversion.converted
        )


def test_a_state_dict_saved_inside_a_with_block_is_gathered_before_it():
    """Twelfth unseen set (VQ-VAE): `with open(path, "wb") as f: torch.save(model.state_dict(),
    f)`; the gathering went inside the block, which goes on rank 0 whole: refused."""
    conversion = unrefused_fixture("save_in_with.py")
    assert (
        "    model_state = full_state_dict(model)\n"
        "    if RANK == 0:\n"
        '        with open("model_{0}.pt".format(epoch + 1), "wb") as f:\n'
        "            torch.save(model_state, f)\n"
    ) in conversion.converted


def test_a_method_that_saves_the_state_dict_gathers_on_every_process():
    """Twelfth unseen set (icpm's Solver): `save()` returned early on the other processes,
    before the gathering, and `torch.save(...)` was taken for a call of that `save()`."""
    conversion = unrefused_fixture("save_method.py")
    assert (
        "    def save(self):\n"
        "        model_state = full_state_dict(self.model)\n"
        "        if RANK == 0:\n"
        '            torch.save(model_state, "model.pth")\n'
        '            print("saved")\n'
    ) in conversion.converted


def unrefused_fixture(name: str) -> Conversion:
    """fixtures/fsdp/`name` converted, with no refusal."""
    path = Path(__file__).resolve().parent.parent / "fixtures" / "fsdp" / name
    conversion = convert_source(path.read_text(), FSDP, str(path))
    assert refusals(conversion) == []
    return conversion


KEEPS_TOTALS = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Autoencoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.totals = []
        self.encoder = nn.Sequential(nn.Linear(16, 4), nn.ReLU())
        self.decoder = nn.Sequential(nn.Linear(4, 16))

    def forward(self, x):
        return self.decode(self.encoder(x))

    def decode(self, z):
        return self.decoder(z)

    def mean_loss(self):
        mean = sum(self.totals) / len(self.totals)
        self.totals.clear()
        return mean


model = Autoencoder()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for (x,) in DataLoader(TensorDataset(torch.rand(64, 16)), batch_size=16):
    loss = (model(x) - x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    model.totals.append(loss.item())
print(model.mean_loss(), model.decode(torch.zeros(1, 4)))
"""


def test_a_method_that_reads_bookkeeping_attributes_is_not_registered():
    """`mean_loss()` calls `self.totals.clear()`, a list's method: it computes nothing with
    the layers, and registered it would gather every parameter at each call. `decode()`
    runs `self.decoder`: registered."""
    converted = convert_source(KEEPS_TOTALS, FSDP, "train.py").converted
    assert 'register_fsdp_forward_method(model, "decode")' in converted
    assert '"mean_loss"' not in converted
