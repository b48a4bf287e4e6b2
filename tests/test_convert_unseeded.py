"""A script that draws its data split (or its data) at start-up from a generator it never
seeds (bench31 S15: torchfm's unseeded `random_split`, triplet's NumPy-drawn triplet lists):
under DDP every process takes rank 0's seed for that generator right after the set-up
block, then re-seeds with its rank before training. A generator the script seeds keeps
its seeding. Run under torchrun by tests/test_convert_unseeded_runs.py."""

from __future__ import annotations

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from running import FIXTURES_DIR

DDP = ConvertOptions(target="ddp", amp="off")
SPLIT = (FIXTURES_DIR / "ddp" / "unseeded_split.py").read_text()
ALIKE = """\
if DISTRIBUTED:
    shared_seed = [torch.initial_seed()]
    dist.broadcast_object_list(shared_seed, src=0)
"""
NUMPY_SPLIT = """\
import numpy as np
import torch

torch.manual_seed(0)
x = torch.randn(64, 1)
order = np.random.permutation(64)
train_x, val_x = x[order[:48]], x[order[48:]]
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    loss = (model(train_x) - 2 * train_x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print((model(val_x) - 2 * val_x).pow(2).mean().item())
"""


def converted(source: str) -> str:
    return convert_source(source, DDP, "train.py").converted


def test_an_unseeded_random_split_is_drawn_alike_on_every_process():
    code = converted(SPLIT)
    alike = ALIKE + "    torch.manual_seed(shared_seed[0])\n"
    assert alike in code
    assert code.index(alike) < code.index("train_set, val_set = random_split(dataset, [48, 16])")
    reseed = "if DISTRIBUTED:\n    torch.manual_seed(torch.initial_seed() + RANK)\n"
    assert code.index(reseed) < code.index("for epoch in range(3):")
    assert converted(code) == code


def test_a_split_drawn_from_its_own_generator_is_left_alone():
    source = SPLIT.replace("[48, 16])", "[48, 16], generator=torch.Generator().manual_seed(0))")
    assert "manual_seed(torch.initial_seed()" not in converted(source)


def test_unseeded_numpy_is_seeded_alike_and_torch_keeps_the_scripts_seed():
    """triplet seeds torch, and draws its triplet lists from NumPy's unseeded generator."""
    code = converted(NUMPY_SPLIT)
    alike = (
        "# numpy.random: not seeded, and drawn from before training. Every process takes rank 0's\n"
        "# seed, to build the same data.\n" + ALIKE + "    np.random.seed(shared_seed[0] % 2**32)\n"
    )
    assert alike in code and "torch.manual_seed(shared_seed[0])" not in code
    assert code.index(alike) < code.index("torch.manual_seed(0)")
    assert (
        "if DISTRIBUTED:\n"
        "    torch.manual_seed(torch.initial_seed() + RANK)\n"
        "    np.random.seed((shared_seed[0] + RANK) % 2**32)\n"
        "for epoch in range(2):\n"
    ) in code


def test_python_random_drawn_in_a_project_function_is_seeded_alike():
    source = (
        NUMPY_SPLIT.replace("import numpy as np\n", "import random\n")
        .replace(
            "order = np.random.permutation(64)",
            "order = shuffled(list(range(64)))",
        )
        .replace(
            "torch.manual_seed(0)\n",
            "\n\ndef shuffled(items):\n    random.shuffle(items)\n    return items\n\n\n",
        )
    )
    code = converted(source)
    assert "    torch.manual_seed(shared_seed[0])\n    random.seed(shared_seed[0])\n" in code
    assert "    random.seed(shared_seed[0] + RANK)\n" in code


def test_a_generator_the_script_seeds_keeps_its_seeding():
    source = NUMPY_SPLIT.replace(
        "torch.manual_seed(0)\n", "torch.manual_seed(0)\nnp.random.seed(0)\n"
    )
    code = converted(source)
    assert "shared_seed" not in code
    assert "if DISTRIBUTED:\n    torch.manual_seed(torch.initial_seed() + RANK)\nfor epoch" in code
