"""A Dataset that uses CUDA in `__getitem__` gets no DataLoader workers and no pinned memory.

CUDA is initialised in the training process before its workers fork, and the first CUDA
call in a worker fails ("Cannot re-initialize CUDA in forked subprocess",
pytorch/pytorch#77159); a sample already on the GPU cannot be pinned. A CPU run shows
neither, so ACC101 and ACC102 (and `convert`, which applies them) leave such a loader alone
and say where the Dataset uses CUDA. fixtures/projects/cuda_dataset: the Dataset lives in
`sounds.py` (the shape of bench30's audio_urbansound).
"""

from __future__ import annotations

import shutil
from textwrap import dedent

import pytest

from autoaccel.config import LintSettings
from autoaccel.convert import command
from autoaccel.convert.log import ConvertOptions
from autoaccel.docs import code_blocks, doc_path, sections
from autoaccel.lint.engine import lint_source
from autoaccel.lint.fixer import fix_source
from running import FIXTURES_DIR

PROJECT = FIXTURES_DIR / "projects" / "cuda_dataset"
DOC_EXAMPLE = code_blocks(sections(doc_path("ACC101").read_text())["Fix safety"])[0]
RULES = LintSettings(select=("ACC101", "ACC102"), unsafe_fixes=True)
SCRIPT = dedent("""\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    device = "cuda" if torch.cuda.is_available() else "cpu"


    class Clips(Dataset):
        def __init__(self, clips):
            self.clips = clips
            self.device = device

        def __getitem__(self, i):
            return self.clips[i].flip(0), 0


    model = nn.Linear(4, 2).to(device)
    loader = DataLoader(Clips(torch.randn(8, 4)), batch_size=4)
    for x, y in loader:
        model(x).sum().backward()
    """)
SAMPLE = "return self.clips[i].flip(0), 0"


def notes(source: str) -> dict[str, str]:
    return {n.code: n.reason for n in fix_source(source, RULES).notes}


def reported(source: str) -> list[str]:
    return [d.code for d in lint_source(source, RULES)]


def test_a_computed_sample_on_the_cpu_gets_workers_and_pinned_memory():
    assert reported(SCRIPT) == ["ACC101", "ACC102"]


@pytest.mark.parametrize(
    "cuda",
    [
        pytest.param(SCRIPT.replace(SAMPLE, "return self.clips[i].flip(0).to(device), 0"), id="to"),
        pytest.param(SCRIPT.replace(SAMPLE, "return self.clips[i].flip(0).cuda(), 0"), id="cuda"),
        pytest.param(
            SCRIPT.replace(SAMPLE, "return self.clips[i] + torch.ones(4, device=self.device), 0"),
            id="device-keyword",
        ),
        pytest.param(
            SCRIPT.replace(SAMPLE, "return self._load(i), 0").replace(
                "    def __getitem__",
                "    def _load(self, i):\n        return self.clips[i].flip(0).to(self.device)\n\n"
                "    def __getitem__",
            ),
            id="method-it-calls",
        ),
        pytest.param(
            SCRIPT.replace(SAMPLE, "return self.spectrum(self.clips[i]), 0").replace(
                "self.device = device", "self.spectrum = nn.Linear(4, 4).to(device)"
            ),
            id="module-moved-in-init",
        ),
        pytest.param(
            SCRIPT.replace(SAMPLE, "return self.clips[i].flip(0).to(self.device), 0")
            .replace("import torch\n", "import os\nimport torch\n", 1)
            .replace(
                '"cuda" if torch.cuda.is_available() else "cpu"',
                'torch.device(os.environ.get("DEVICE", "cuda"))',
            ),
            id="device-of-unknown-type",
        ),
    ],
)
def test_a_dataset_that_uses_cuda_gets_neither_and_says_where(cuda):
    assert reported(cuda) == []
    found = notes(cuda)
    assert "may use CUDA (line " in found["ACC101"]
    assert "Cannot re-initialize CUDA in forked subprocess" in found["ACC101"]
    assert "move the `.to(device)` out of `__getitem__`" in found["ACC101"]
    assert "cannot be pinned" in found["ACC102"]


@pytest.mark.parametrize(
    "cpu",
    [
        pytest.param(
            SCRIPT.replace(SAMPLE, "return self.clips[i].flip(0).to(device), 0").replace(
                '"cuda" if torch.cuda.is_available() else "cpu"', '"cpu"'
            ),
            id="cpu-device",
        ),
        pytest.param(
            SCRIPT.replace(SAMPLE, "return self.clips[i].flip(0).to(torch.float64), 0"),
            id="dtype",
        ),
    ],
)
def test_a_dataset_that_stays_on_the_cpu_is_not_declined(cpu):
    assert "ACC101" in reported(cpu)
    assert "ACC101" not in notes(cpu)


def test_the_doc_example_is_declined_with_its_line():
    assert reported(DOC_EXAMPLE) == []
    line = DOC_EXAMPLE.splitlines().index(
        "        return self.clips[i].to(device), self.labels[i]  # not reported: workers cannot"
    )
    assert f"may use CUDA (line {line + 1})" in notes(DOC_EXAMPLE)["ACC101"]
    # moved out of `__getitem__` as the doc says, the sample is a row in memory
    moved = DOC_EXAMPLE.replace("self.clips[i].to(device)", "self.clips[i]")
    assert "rows of tensors already in memory" in notes(moved)["ACC101"]


def test_convert_names_the_line_in_the_datasets_file(tmp_path, capsys):
    folder = tmp_path / "project"
    shutil.copytree(PROJECT, folder)
    options = ConvertOptions(target="ddp", amp="off")
    assert command.run_convert(folder / "train.py", options, output=tmp_path / "out") == 0
    converted = (tmp_path / "out" / "train.py").read_text()
    assert "DistributedSampler(dataset" in converted
    assert "num_workers=" not in converted and "pin_memory=" not in converted
    out = capsys.readouterr().out
    line = (
        (PROJECT / "sounds.py")
        .read_text()
        .splitlines()
        .index("        clip = self.clips[index].to(self.device)")
    )
    assert "line 22: ACC101 (dataloader-without-workers) not applied: the Dataset's" in out
    assert f"may use CUDA (sounds.py:{line + 1})" in out
