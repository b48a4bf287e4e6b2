"""`convert --to ddp|fsdp` with facts from a short run, proven by running the results.

For each fixture of fixtures/facts/ that the static model refuses and the facts let
convert: `autoaccel convert` (which runs the original for a few steps), then the result
under torchrun on two processes (forked, `running.run_ranks`) through the harness, whose
record holds each rank's parameter digest. Both ranks must finish, hold the same
parameters, and (unshuffled data, no dropout: two halves of each batch average to the
whole batch's gradient) the original's final parameters.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from running import FIXTURES_DIR, _check, run_autoaccel, run_ranks, run_script, run_under_harness
from test_facts import SNAPSHOTS

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.runs

ARGS = ("--epochs", "2")
PROBE = textwrap.dedent("""\
    import sys
    from autoaccel.run import harness
    sys.exit(harness.main(["--losses-out", "record-{rank}.json", *sys.argv[1:]]))
    """)


def digest(params: list) -> list[float]:
    tensors = [p.double() for p in params]
    return [sum(float(t.sum()) for t in tensors), sum(float(t.abs().sum()) for t in tensors)]


@pytest.mark.parametrize(
    "name, target",
    [
        ("kwargs_trainer", "ddp"), ("kwargs_trainer", "fsdp"), ("model_factory", "ddp"), ("model_factory", "fsdp"),
        ("model_dict", "ddp"),  # `models["net"](x)`: the item wrapped
        # `mylib.train_step(model, opt, x, y)`: the project, run, converted into a folder
        ("step_module/train", "ddp"), ("step_module/train", "fsdp"),
    ],
)  # fmt: skip
def test_converted_with_facts_trains_the_same_on_two_ranks(tmp_path, name, target):
    fixture = FIXTURES_DIR / "facts" / f"{name}.py"
    project = "/" in name  # written with the modules it imports: `-o DIR`
    out = tmp_path / (f"{target}/{fixture.name}" if project else f"{name}_{target}.py")
    conversion = run_autoaccel(
        "convert", fixture, "--to", target, "--amp", "off", "-o", out.parent if project else out, "--no-verify",
        "--", *ARGS, cwd=tmp_path,
    )  # fmt: skip
    _check(conversion, f"autoaccel convert {name} --to {target}")
    assert "running the script for 5 training steps" in conversion.stderr
    assert "took 5 training steps" in conversion.stderr
    original = run_script(fixture, (*ARGS, "--save-params", tmp_path / "original.pt"), tmp_path)
    _check(original, f"python {name}")
    (tmp_path / "probe.py").write_text(PROBE)
    ranks = run_ranks(tmp_path / "probe.py", (out, *ARGS), tmp_path)
    _check(ranks, f"torchrun {out.name}")
    records = [json.loads((tmp_path / f"record-{rank}.json").read_text()) for rank in range(2)]
    assert [r["exit"] for r in records] == ["ok", "ok"]
    # the optimizer's parameters: [sum, sum of absolute values] (then the DDP wrapper's)
    first, second = (r["param_digest"][0] for r in records)
    assert first == pytest.approx(second, rel=1e-9)  # the ranks hold the same parameters
    assert first != pytest.approx(records[0]["first_param_digest"][0])  # and they trained
    expected = digest(torch.load(tmp_path / "original.pt"))
    assert first == pytest.approx(expected, rel=1e-5)  # the original's parameters


@pytest.mark.parametrize(
    "name", sorted(str(p.relative_to(SNAPSHOTS).with_suffix("")) for p in SNAPSHOTS.rglob("*.json"))
)
def test_fact_snapshots_are_current(tmp_path, name):
    """What the recorder writes for each fixture now is tests/snapshots/facts/NAME.json."""
    out = tmp_path / "facts.json"
    run_under_harness(
        FIXTURES_DIR / "facts" / f"{name}.py", [], tmp_path, {"AUTOACCEL_FACTS_OUT": str(out)}, 5
    )
    root = Path(__file__).resolve().parent.parent

    def relative(value):
        if isinstance(value, dict):
            return {
                k: (
                    str(Path(v).relative_to(root))
                    if k == "path" and isinstance(v, str) and v.startswith(str(root))
                    else relative(v)
                )
                for k, v in value.items()
                if k not in ("seconds", "files", "script")
            }
        return [relative(v) for v in value] if isinstance(value, list) else value

    assert relative(json.loads(out.read_text())) == json.loads(
        (SNAPSHOTS / f"{name}.json").read_text()
    )
