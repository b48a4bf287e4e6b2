"""fixtures/ddp/episode_guard.py converted with `--to ddp`, run on two ranks (gloo): each
rank fills its own replay buffer, and they learn after the same episodes (`every_process()`),
so the run ends (before, the rank whose buffer filled first trained alone and failed)."""

from __future__ import annotations

import json
import textwrap

import pytest
from running import FIXTURES_DIR, _check, run_ranks

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

pytestmark = pytest.mark.runs

PROBE = textwrap.dedent("""\
    # Run a script and write probe-<RANK>.json: the sums of the parameters after each
    # optimizer step, and the states in the script's replay buffer `memory` at the end.
    import json
    import os
    import runpy
    import sys

    from torch.optim.optimizer import register_optimizer_step_post_hook

    steps = []
    register_optimizer_step_post_hook(
        lambda optimizer, args, kwargs: steps.append(
            [p.detach().sum().item() for group in optimizer.param_groups for p in group["params"]]
        )
    )
    script, sys.argv = sys.argv[1], sys.argv[1:]
    names = runpy.run_path(script, run_name="__main__")
    with open(f"probe-{os.environ.get('RANK', 0)}.json", "w") as f:
        json.dump({"steps": steps, "buffer": [t[0].tolist() for t in names["memory"].transitions]}, f)
    """)


def test_ranks_with_their_own_buffers_learn_together(tmp_path):
    name = "ddp/episode_guard.py"
    conversion = convert_source(
        (FIXTURES_DIR / name).read_text(), ConvertOptions(target="ddp", amp="off"), name
    )
    assert not [s for s in conversion.log.skipped if s.wrong]
    (tmp_path / "episode_guard.py").write_text(conversion.converted)
    (tmp_path / "probe.py").write_text(PROBE)
    _check(
        run_ranks(tmp_path / "probe.py", [tmp_path / "episode_guard.py"], tmp_path),
        "two ranks of episode_guard.py",
    )
    rank0, rank1 = (json.loads((tmp_path / f"probe-{rank}.json").read_text()) for rank in (0, 1))
    assert rank0["buffer"] != rank1["buffer"]  # each its own environment and exploration
    assert len(rank0["steps"]) == len(rank1["steps"]) > 0
    for mine, theirs in zip(rank0["steps"], rank1["steps"]):
        assert mine == pytest.approx(theirs, rel=1e-6)  # the same averaged gradients
