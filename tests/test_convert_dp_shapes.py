"""`--to dp` on the shapes of fixtures/dp/: which steps move into `LossInForward`, which
are refused (naming the line), and that a refusal exits 1 as `--to ddp`'s do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
DP = ConvertOptions(target="dp", amp="off")


def converted(name: str):
    return convert_source((FIXTURES / name).read_text(encoding="utf-8"), DP, str(FIXTURES / name))


@pytest.mark.parametrize(
    ("name", "excerpts"),
    [
        pytest.param("two_inputs.py", ["def compute_loss(model, x_noisy, t, noise):",
                                       "loss = loss_on_gpus(x_noisy, t, noise).mean()"], id="two-inputs"),
        pytest.param("trainer_attribute.py", [
            "def compute_loss(model, criterion, tokens, lengths, y):",
            "            logits = model(tokens, lengths)[0]\n            logits = logits.squeeze(1)\n",
            "loss_on_gpus = LossInForward(compute_loss, self.model, self.criterion)",
            # the timer stays outside, after the call
            "loss, logits = loss_on_gpus(tokens, lengths, y)\n",
        ], id="trainer-attribute"),
        pytest.param("gan_two_steps.py", [
            "def compute_g_loss(generator, discriminator, adversarial_loss, z, valid):",
            "d_loss_on_gpus = LossInForward(compute_d_loss, discriminator, adversarial_loss)",
            "g_loss, gen_imgs = g_loss_on_gpus(z, valid)",
        ], id="gan"),
        pytest.param("distill_frozen.py", [
            "loss_on_gpus = LossInForward(compute_loss, student)\n",
            "loss, distill = loss_on_gpus(x, soft, y)",
        ], id="frozen-teacher"),
        pytest.param("existing_dp_step.py", [
            "loss_on_gpus = LossInForward(compute_loss, model, criterion)",
            "torch.save(model.state_dict()",
        ], id="existing-data-parallel"),
    ],
)
def test_step_moves_into_loss_in_forward(name: str, excerpts: list[str]) -> None:
    conversion = converted(name)
    code = conversion.converted
    for excerpt in excerpts:
        assert excerpt in code, excerpt
    assert not [s for s in conversion.log.skipped if s.wrong]
    compile(code, name, "exec")


def test_timer_stays_outside_the_wrapper() -> None:
    code = converted("trainer_attribute.py").converted
    function = code[code.index("def compute_loss"): code.index("return loss, logits")]
    assert "perf_counter" not in function
    assert code.index("loss_on_gpus(tokens") < code.index("elapsed = time.perf_counter() - start")


def test_frozen_teacher_gets_no_wrapper() -> None:
    code = converted("distill_frozen.py").converted
    assert "teacher" not in code[code.index("def compute_loss"): code.index("loss_on_gpus = ")]
    assert "nn.DataParallel(model)" not in code and "DataParallel(teacher" not in code


def test_existing_data_parallel_is_upgraded() -> None:
    code = converted("existing_dp_step.py").converted
    assert "model = nn.DataParallel(model)" not in code
    assert "loss_on_gpus = nn.DataParallel(loss_on_gpus)" in code


@pytest.mark.parametrize(
    ("name", "line", "reason"),
    [
        pytest.param("recurrent_state.py", 28, "(a recurrent state)", id="recurrent-state"),
        pytest.param("forward_attribute.py", 29, "sets `self.aux` (line 17)", id="forward-attribute"),
    ],
)
def test_refused_naming_the_line(name: str, line: int, reason: str) -> None:
    skipped = [s for s in converted(name).log.skipped if s.wrong]
    assert len(skipped) == 1 and reason in skipped[0].reason
    assert f"line {line}: " in skipped[0].reason


def test_dp_that_adds_no_data_parallel_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "out.py"
    proc = subprocess.run(
        [sys.executable, "-m", "autoaccel", "convert", str(FIXTURES / "recurrent_state.py"),
         "--to", "dp", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "--to dp refused: no DataParallel was added" in proc.stderr and "recurrent state" in proc.stderr
    assert not out.exists()
