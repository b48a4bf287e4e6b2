"""DataLoader workers are added only where they help, and never against the script's choice."""

from __future__ import annotations

from textwrap import dedent

from running import FIXTURES_DIR

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import Conversion, convert_source

SINGLE = ConvertOptions(target="single", amp="off")
MNIST = (FIXTURES_DIR / "mnist_main.py").read_text()
# mnist_main.py's dataset, made to compute its samples (as torchvision's MNIST decodes them)
COMPUTED_MNIST = MNIST.replace(
    "return self.data[index], int(self.targets[index])",
    "return self.data[index].clamp(-1, 3), int(self.targets[index])",
)
TENSORS = dedent("""\
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    train_set = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    loader = DataLoader(train_set, batch_size=8, shuffle=True)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """)


def reasons(conversion: Conversion) -> list[str]:
    return [s.reason for s in conversion.log.skipped if s.what.startswith("ACC101")]


def test_rows_of_tensors_in_memory_get_no_workers():
    conversion = convert_source(TENSORS, SINGLE)
    assert "num_workers" not in conversion.converted
    assert any("rows of tensors already in memory" in r for r in reasons(conversion))


def test_a_dataset_that_computes_its_samples_gets_workers():
    source = TENSORS.replace("TensorDataset(", "Augmented(").replace(
        "import torch\n",
        "import torch\nfrom torch.utils.data import Dataset\n\n\nclass Augmented(Dataset):\n"
        "    def __init__(self, x, y):\n        self.x, self.y = x, y\n\n"
        "    def __getitem__(self, i):\n        return self.x[i] + torch.randn(4), self.y[i]\n\n",
        1,
    )
    conversion = convert_source(source, SINGLE)
    assert "num_workers=min(8, os.cpu_count() or 1)" in conversion.converted
    assert not reasons(conversion)


def test_mnist_cuda_kwargs_keep_the_script_workers_and_say_so():
    """pytorch/examples' mnist sets `num_workers=1` through `cuda_kwargs` on the CUDA
    path: a default written into `train_kwargs` would only reach the CPU path."""
    conversion = convert_source(COMPUTED_MNIST, SINGLE)
    assert "train_kwargs = {'batch_size': args.batch_size}\n" in conversion.converted
    assert "cuda_kwargs = {'num_workers': 1," in conversion.converted
    assert "os.cpu_count" not in conversion.converted
    assert any("sets `num_workers` on some paths only" in r for r in reasons(conversion))


def test_mnist_fixture_reads_rows_in_memory():
    conversion = convert_source(MNIST, SINGLE)
    assert "os.cpu_count" not in conversion.converted
    assert any("rows of tensors already in memory" in r for r in reasons(conversion))
