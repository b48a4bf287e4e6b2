"""Shapes of the public corpus that `--to ddp` / `--to fsdp` got wrong (issue 29, item 4),
each as a fixture of our own: a script that is distributed already (nanoGPT), a WGAN-GP
critic reached by the step and by its gradient penalty, a VAE whose evaluation calls
`model.decode(z)`, a regression that draws its target unseeded, and a script that writes
a progress bar and matplotlib figures. tests/test_convert_corpus_shapes_runs.py runs them
on two processes."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from autoaccel.analysis.side_effects import EffectKind, find_side_effects
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.source import parse

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DDP = ConvertOptions(target="ddp", amp="off")
FSDP = ConvertOptions(target="fsdp", amp="off")
CASES = [
    ("ddp/random_target.py", DDP),
    ("ddp/progress_plots.py", DDP),
    ("fsdp/wgan_gp.py", DDP),
    ("fsdp/wgan_gp.py", FSDP),
    ("fsdp/vae_methods.py", FSDP),
]


def converted(name: str, options: ConvertOptions) -> str:
    return convert_source((FIXTURES / name).read_text(), options, Path(name).name).converted


@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{o.target}" for n, o in CASES])
def test_a_second_conversion_changes_nothing(name, options):
    once = converted(name, options)
    assert once != (FIXTURES / name).read_text()
    assert convert_source(once, options, Path(name).name).converted == once


# -- a. a script that is distributed already ------------------------------------------


def test_an_already_distributed_script_has_nothing_to_do(cli, tmp_path):
    shutil.copy(FIXTURES / "ddp/already_distributed.py", tmp_path / "train.py")
    run = cli("convert", "train.py", "--to", "ddp", "-o", "out.py")
    assert run.exit_code == 0
    assert run.stdout == "train.py: nothing to do: the script is already distributed (line 12)\n"
    assert run.stderr == ""
    assert not (tmp_path / "out.py").exists()


def test_nothing_to_do_writes_nothing_in_place_and_passes_check(cli, tmp_path):
    original = (FIXTURES / "ddp/already_distributed.py").read_bytes()
    (tmp_path / "train.py").write_bytes(original)
    assert cli("convert", "train.py", "--to", "ddp", "--write", "--no-verify").exit_code == 0
    assert cli("convert", "train.py", "--to", "ddp", "--check").exit_code == 0
    assert (tmp_path / "train.py").read_bytes() == original


def test_nothing_to_do_in_json(cli, tmp_path):
    shutil.copy(FIXTURES / "ddp/already_distributed.py", tmp_path / "train.py")
    run = cli("convert", "train.py", "--to", "ddp", "--format", "json")
    assert run.exit_code == 0
    assert json.loads(run.stdout) == {
        "path": "train.py",
        "changed": False,
        "nothing_to_do": "the script is already distributed",
        "line": 12,
    }


def test_an_already_distributed_script_of_a_project_has_nothing_to_do(cli, tmp_path):
    """nanoGPT's train.py imports its model from model.py beside it."""
    script = (FIXTURES / "ddp/already_distributed.py").read_text()
    model = "import torch.nn as nn\n\n\ndef make_model():\n    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))\n"
    (tmp_path / "model.py").write_text(model)
    script = script.replace(
        "import torch.nn as nn\n", "import torch.nn as nn\nfrom model import make_model\n"
    )
    (tmp_path / "train.py").write_text(script.replace(
        "model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))", "model = make_model()"
    ))  # fmt: skip
    run = cli("convert", "train.py", "--to", "ddp", "--write")
    assert run.exit_code == 0
    assert run.stdout == "train.py: nothing to do: the script is already distributed (line 13)\n"
    assert (tmp_path / "model.py").read_text() == model


def test_fsdp_of_a_ddp_script_is_still_refused(cli, tmp_path):
    """Turning DDP into FSDP is a conversion, and not one autoaccel makes."""
    shutil.copy(FIXTURES / "ddp/already_distributed.py", tmp_path / "train.py")
    run = cli("convert", "train.py", "--to", "fsdp")
    assert run.exit_code == 1
    assert (
        "train.py:12:1: error: --to ddp not applied: the script already sets up torch.distributed"
        in run.stderr
    )


# -- b. a model reached by two paths ------------------------------------------------------


def test_a_critic_called_in_the_step_and_in_its_gradient_penalty_is_wrapped_once():
    code = converted("fsdp/wgan_gp.py", DDP)
    assert code.count("DDP(\n        discriminator,") == 1
    assert "ddp_discriminator2" not in code
    # the penalty's forward goes through the one wrapper, as the step's do
    assert (
        "compute_gradient_penalty(\n            ddp_discriminator, real, fake.detach()\n        )"
        in code
    )
    assert "g_loss = -ddp_discriminator(ddp_generator(z)).mean()" in code


def test_a_critic_called_in_the_step_and_in_its_gradient_penalty_is_sharded_once():
    code = converted("fsdp/wgan_gp.py", FSDP)
    assert code.count("shard_model(discriminator)") == 1
    assert code.count("shard_model(generator)") == 1


# -- c. methods other than forward on a sharded model ------------------------------------


def test_methods_called_on_a_sharded_model_are_registered_as_forward_methods():
    code = converted("fsdp/vae_methods.py", FSDP)
    assert "from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method\n" in code
    assert (
        "if DISTRIBUTED:\n"
        "    shard_model(model)\n"
        "    # encode() and decode() gather the parameters too, as forward() does\n"
        '    register_fsdp_forward_method(model, "encode")\n'
        '    register_fsdp_forward_method(model, "decode")\n'
        "optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)\n"
    ) in code


def test_ddp_registers_nothing():
    """Under DDP the evaluation runs on the bare model, which has all its methods."""
    assert "register_fsdp_forward_method" not in converted("fsdp/vae_methods.py", DDP)


GETTER = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block_size = 4
        self.fc = nn.Linear(4, 4)

    def get_block_size(self):
        return self.block_size

    def forward(self, x):
        return self.fc(x)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(torch.randn(64, model.get_block_size()), batch_size=8)
for x in loader:
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_method_that_computes_nothing_with_the_layers_is_not_registered():
    """minGPT's `get_block_size()`: registered, it would gather the parameters (every
    process at once) to read a number."""
    code = convert_source(GETTER, FSDP, "train.py").converted
    assert "shard_model(model)" in code
    assert "register_fsdp_forward_method" not in code


# -- d. random numbers drawn before training, unseeded -------------------------------


def test_an_unseeded_target_is_drawn_alike_on_every_process():
    code = converted("ddp/random_target.py", DDP)
    seed_alike = (
        "# Not seeded, and random numbers are drawn before training: every process takes rank 0's\n"
        "# seed, to build the same model, data and targets.\n"
        "if DISTRIBUTED:\n"
        "    shared_seed = [torch.initial_seed()]\n"
        "    dist.broadcast_object_list(shared_seed, src=0)\n"
        "    torch.manual_seed(shared_seed[0])\n"
    )
    assert seed_alike in code
    assert code.index(seed_alike) < code.index("W_target = torch.randn(POLY_DEGREE, 1) * 2")
    # then each process draws its own batches
    reseed = "if DISTRIBUTED:\n    torch.manual_seed(torch.initial_seed() + RANK)\nfor batch_idx in range(1, 2001):"
    assert reseed in code


def test_an_unseeded_script_that_draws_nothing_before_training_is_not_seeded():
    source = (FIXTURES / "ddp/random_target.py").read_text()
    source = source.replace("torch.randn(POLY_DEGREE, 1) * 2", "torch.ones(POLY_DEGREE, 1)")
    source = source.replace("torch.randn(1) * 2", "torch.ones(1)")
    code = convert_source(source, DDP, "train.py").converted
    assert "DDP(" in code and "manual_seed" not in code


def test_a_draw_through_a_function_of_the_script_counts():
    source = (FIXTURES / "ddp/random_target.py").read_text()
    source = source.replace(
        "W_target = torch.randn(POLY_DEGREE, 1) * 2\nb_target = torch.randn(1) * 2\n",
        "def draw(*shape):\n    return torch.randn(*shape) * 2\n\n\nW_target = draw(POLY_DEGREE, 1)\nb_target = draw(1)\n",
    )
    assert (
        "shared_seed = [torch.initial_seed()]" in convert_source(source, DDP, "train.py").converted
    )


# -- e. every side effect of rank 1 ----------------------------------------------------


def test_progress_bars_and_matplotlib_writes_run_on_rank_zero():
    code = converted("ddp/progress_plots.py", DDP)
    assert (
        "        if RANK == 0:\n"
        "            sys.stdout.write(\n"
        "                f\"\\r[{'=' * done}{'.' * (20 - done)}] epoch {epoch} loss {loss.item():.4f}\"\n"
        "            )\n"
        "            sys.stdout.flush()\n"
        "    if RANK == 0:\n"
        '        sys.stdout.write("\\n")\n'
    ) in code
    assert 'if RANK == 0:\n    fig.savefig("losses.png")\n' in code
    assert 'if RANK == 0:\n    anim.save("fits.gif", writer="pillow")\n' in code
    assert "if RANK == 0:\n    ax.plot(losses)" not in code  # drawing writes nothing


def _effects(source: str) -> list[tuple[EffectKind, str]]:
    module = parse(textwrap.dedent(source))
    return [(e.kind, module.code_for_node(e.call)) for e in find_side_effects(module).effects]


@pytest.mark.parametrize(
    ("source", "found"),
    [
        pytest.param(
            "import sys\nsys.stderr.write('x')\n",
            [(EffectKind.PRINT, "sys.stderr.write('x')")],
            id="stderr",
        ),
        pytest.param(
            "from matplotlib import animation\nanim = animation.FuncAnimation(fig, f)\nanim.save('a.gif')\n",
            [(EffectKind.FILE_WRITE, "anim.save('a.gif')")],
            id="animation",
        ),
        pytest.param(
            "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nfig.savefig('a.png')\n",
            [(EffectKind.FILE_WRITE, "fig.savefig('a.png')")],
            id="figure-of-subplots",
        ),
        pytest.param(
            "import imageio\nimageio.mimsave('a.gif', frames)\n",
            [(EffectKind.FILE_WRITE, "imageio.mimsave('a.gif', frames)")],
            id="imageio",
        ),
        pytest.param("trainer.save('last')\nmodel.save(path)\n", [], id="save-of-another-object"),
    ],
)
def test_side_effects_found(source, found):
    assert _effects(source) == found
