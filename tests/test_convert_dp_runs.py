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
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reference = run_under_harness(FIXTURES / name, [], tmp_path / "a").losses
    dp = run_under_harness(converted, [], tmp_path / "b").losses
    assert len(dp) == len(reference) > 0
    for step, (a, b) in enumerate(zip(reference, dp)):
        assert b == pytest.approx(a, rel=EXACT_REL), f"step {step}: original {a}, dp {b}"
