"""fixtures/dp/ converted with `--to dp --amp off` train like the originals: on CPU
`LossInForward` is not wrapped in `nn.DataParallel` (no GPU), so every loss the harness
records must equal the original's."""

from __future__ import annotations

from pathlib import Path

import pytest

from running import convert, run_under_harness
from test_convert_runs import EXACT_REL

pytestmark = pytest.mark.runs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
CONVERTED = ["two_inputs.py", "trainer_attribute.py", "gan_two_steps.py", "distill_frozen.py", "existing_dp_step.py",
             "loss_function.py", "summed_vae.py", "gan_batch_size_labels.py"]


@pytest.mark.parametrize("name", CONVERTED)
def test_dp_shape_trains_like_the_original(name: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    converted = convert(FIXTURES / name, tmp_path, "--to", "dp", "--amp", "off")
    code = converted.read_text(encoding="utf-8")
    assert "LossInForward(" in code
    assert_trains_like_the_original(FIXTURES / name, converted, tmp_path)


def test_flattened_input_converts_with_what_a_short_run_showed(cli, tmp_path: Path) -> None:
    """`x.view(-1, image_size)` before `model(x)`: the code alone cannot tell whether it
    merges the batch (`--no-run` refuses: tests/test_convert_dp_shapes.py); `convert`
    runs the script for 5 steps, which show `x` as `[10, 16]` in steps of 10 samples."""
    pytest.importorskip("torch")
    out = tmp_path / "flattened_vae.dp.py"
    result = cli("convert", str(FIXTURES / "flattened_vae.py"), "--to", "dp", "--amp", "off", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert "batch-first is not clear from the code alone: running the script for 5 training steps" in result.stderr
    assert "batch-first as a short run of the script showed: `x`" in result.stdout
    assert "loss, kl_div, reconst_loss = loss_on_gpus(x)\n" in out.read_text(encoding="utf-8")
    assert_trains_like_the_original(FIXTURES / "flattened_vae.py", out, tmp_path)


def assert_trains_like_the_original(original: Path, converted: Path, tmp_path: Path) -> None:
    """Every loss the harness records for `converted` equals the original's."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reference = run_under_harness(original, [], tmp_path / "a").losses
    dp = run_under_harness(converted, [], tmp_path / "b").losses
    assert len(dp) == len(reference) > 0
    for step, (a, b) in enumerate(zip(reference, dp)):
        assert b == pytest.approx(a, rel=EXACT_REL), f"step {step}: original {a}, dp {b}"
