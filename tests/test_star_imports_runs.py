"""Proof by running: fixtures/projects/star_import_lm (char-rnn's shape: `random` and the
model's class come by star imports, each step draws new random chunks) converted
`--to ddp` trains on two processes (gloo, CPU). A probe records per rank the chunk
offsets `random.randint` drew, what the script printed, the files `torch.save` wrote,
and the final parameters: the ranks draw other chunks, take as many steps, end with
equal parameters, and only rank 0 prints and saves."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
from running import _check, run_ranks
from test_star_imports import LM, converted

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

PROBE = textwrap.dedent("""\
    # Run a script and write probe-<RANK>.json: what random.randint drew, what the script
    # printed, the files torch.save wrote, and the model's parameters at the end.
    import contextlib
    import io
    import json
    import os
    import random
    import runpy
    import sys

    import torch

    seen = {"draws": [], "saves": []}
    randint, save = random.randint, torch.save


    def recording_randint(a, b):
        drawn = randint(a, b)
        seen["draws"].append(drawn)
        return drawn


    def recording_save(obj, f, *args, **kwargs):
        seen["saves"].append(os.fspath(f))
        return save(obj, f, *args, **kwargs)


    random.randint, torch.save = recording_randint, recording_save
    script, sys.argv = sys.argv[1], sys.argv[1:]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        names = runpy.run_path(script, run_name="__main__")
    seen["printed"] = printed.getvalue()
    seen["parameters"] = [p.detach().flatten().tolist() for p in names["model"].parameters()]
    with open(f"probe-{os.environ.get('RANK', 0)}.json", "w") as f:
        json.dump(seen, f)
    """)
DRAWS = 12 * 8  # steps x chunks per batch


def test_each_rank_draws_its_own_chunks_and_the_model_stays_one(tmp_path):
    for name, conversion in converted("ddp").items():
        (tmp_path / name).write_text(conversion.converted, encoding="utf-8")
    for kept in ("helpers.py", "model.py"):
        shutil.copy(LM / kept, tmp_path / kept)
    (tmp_path / "probe.py").write_text(PROBE)
    _check(
        run_ranks(tmp_path / "probe.py", (tmp_path / "train.py",), tmp_path),
        "two ranks of star_import_lm",
    )
    rank0, rank1 = (json.loads((tmp_path / f"probe-{rank}.json").read_text()) for rank in (0, 1))
    assert len(rank0["draws"]) == len(rank1["draws"]) == DRAWS
    assert rank0["draws"] != rank1["draws"]
    assert rank0["parameters"] == rank1["parameters"]
    assert rank0["printed"].count("loss") == 3 and rank1["printed"] == ""
    assert rank0["saves"] == ["star_import_lm.pt"] and rank1["saves"] == []
