"""fixtures/dp/ converted with `--to dp` train like the originals. On a CPU the converted
script would not wrap `LossInForward` in `nn.DataParallel` (no GPU), and DataParallel
itself would not split anything: the runs replace it with `SplitInTwo`, which splits
every tensor argument along dimension 0 as DataParallel's scatter does (each must have
the batch's size there: a 0-dim loss or a tensor made elsewhere fails), runs each half
and concatenates the results, so every loss the harness records must equal the
original's (up to the order of additions)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from autoaccel.convert.log import Amp, ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.transforms.data_parallel.step_segments import RUN_CAN_TELL
from running import run_under_harness
from test_convert_runs import EXACT_REL

pytestmark = pytest.mark.runs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
CONVERTED = [
    "two_inputs.py",
    "trainer_attribute.py",
    "gan_two_steps.py",
    "distill_frozen.py",
    "existing_dp_step.py",
    "loss_function.py",
    "summed_vae.py",
    "gan_batch_size_labels.py",
    "zero_grad_before_loss.py",
    "stacked_batches.py",
    "next_batch_retry.py",
]
# converted with the default mixed precision (its autocast is off on a CPU)
WITH_AMP = ["gan_amp_real_loss.py", "loss_in_model_amp.py", "semicolon_step.py"]
# the split of two halves adds in another order than the whole batch
SPLIT_REL = 1e-4

SPLIT_IN_TWO = """\
import torch as _torch


class SplitInTwo(_torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *inputs):
        tensors = [x for x in inputs if isinstance(x, _torch.Tensor)]
        sizes = {x.size(0) if x.dim() else None for x in tensors}
        assert len(sizes) == 1 and None not in sizes, f"not batch-first: {[list(x.shape) for x in tensors]}"
        halves = [x.tensor_split(2) if isinstance(x, _torch.Tensor) else (x, x) for x in inputs]
        return _gather([self.module(*(h[i] for h in halves)) for i in range(2)])


def _gather(outputs):
    if isinstance(outputs[0], tuple):
        return tuple(_gather(list(parts)) for parts in zip(*outputs))
    return _torch.cat([o.reshape(1) if o.dim() == 0 else o for o in outputs])


_torch.nn.DataParallel = SplitInTwo
"""


@pytest.mark.parametrize(
    ("name", "amp"),
    [
        *(pytest.param(n, "off", id=n) for n in CONVERTED),
        *(pytest.param(n, "bf16", id=n) for n in WITH_AMP),
    ],
)
def test_dp_shape_trains_like_the_original(name: str, amp: Amp, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    fixture = FIXTURES / name
    # converted in this process: a `convert` command would import and parse it all again
    code = convert_source(
        fixture.read_text(encoding="utf-8"), ConvertOptions(target="dp", amp=amp), str(fixture)
    ).converted
    assert "LossInForward(" in code
    assert_trains_like_the_original(
        fixture, split_in_two(code, tmp_path / name), tmp_path, SPLIT_REL
    )


def split_in_two(code: str, path: Path) -> Path:
    """`code` (a conversion), written to `path` with its wrappers made `SplitInTwo`s (a
    DataParallel over two halves of each batch) on the CPU too."""
    gate = ".is_cuda:  # one replica per visible GPU"
    assert gate in code
    code = code.replace(gate, ".is_cuda or True:")
    # after `from __future__` imports, which must come first
    after = max(
        (
            s.end_lineno
            for s in ast.parse(code).body
            if isinstance(s, ast.ImportFrom) and s.module == "__future__"
        ),
        default=0,
    )
    lines = code.splitlines(keepends=True)
    path.write_text(
        "".join(lines[:after]) + SPLIT_IN_TWO + "".join(lines[after:]), encoding="utf-8"
    )
    return path


def test_flattened_input_converts_with_what_a_short_run_showed(cli, tmp_path: Path) -> None:
    """`x.view(-1, image_size)` before `model(x)`: the code alone cannot tell whether it
    merges the batch (`--no-run` refuses: tests/test_convert_dp_shapes.py); `convert`
    runs the script for 5 steps, which show `x` as `[10, 16]` in steps of 10 samples."""
    pytest.importorskip("torch")
    out = tmp_path / "flattened_vae.dp.py"
    result = cli(
        "convert", str(FIXTURES / "flattened_vae.py"), "--to", "dp", "--amp", "off", "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    assert (
        "batch-first is not clear from the code alone: running the script for 5 training steps"
        in result.stderr
    )
    assert "batch-first as a short run of the script showed: `x`" in result.stdout
    assert "loss, kl_div, reconst_loss = loss_on_gpus(x)\n" in out.read_text(encoding="utf-8")
    assert_trains_like_the_original(FIXTURES / "flattened_vae.py", out, tmp_path)


def test_a_project_is_refused_when_the_run_trains_none_of_what_it_wraps(cli, tmp_path) -> None:
    """fixtures/dp/gan_by_flag: gan.py gets DataParallel, acgan.py is refused, and the run
    trains ACGAN (its `--gan` default). Eleventh unseen set (pytorch-generative-model-
    collections): this was written, exit 0. The run also answers what acgan.py's forward
    returns, which only the script's own module got before (the refusal said "a short run
    can show" after the run)."""
    shutil.copytree(FIXTURES / "gan_by_flag", tmp_path / "gan_by_flag")
    result = cli("convert", "gan_by_flag/main.py", "--to", "dp", "--amp", "off", "-o", "out")
    assert result.exit_code == 1, result.stderr
    assert (
        "acgan.py:42:1: error: loss inside forward (--to dp) not applied: `Discriminator.forward`"
        " sets `self.features` (line 17)" in result.stderr
    )
    assert RUN_CAN_TELL not in result.stderr and not (tmp_path / "out").exists()
    assert "gan.py: 4 changes" in result.stdout  # a DataParallel the run would never build


def assert_trains_like_the_original(
    original: Path, converted: Path, tmp_path: Path, rel: float = EXACT_REL
) -> None:
    """Every loss the harness records for `converted` equals the original's."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reference = run_under_harness(original, [], tmp_path / "a").losses
    dp = run_under_harness(converted, [], tmp_path / "b").check().losses
    assert len(dp) == len(reference) > 0
    for step, (a, b) in enumerate(zip(reference, dp)):
        assert b == pytest.approx(a, rel=rel), f"step {step}: original {a}, dp {b}"
