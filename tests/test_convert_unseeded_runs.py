"""Proof by running: fixtures/ddp/unseeded_split.py (an unseeded `random_split`) converted
to ddp, under `torchrun --nproc_per_node=2` (gloo, CPU). Every process holds the same
split, so the training shards are disjoint and every process validates on the same part;
the converted script still runs as one process under plain `python`."""

from __future__ import annotations

import json
import shutil

import pytest

from running import DDP_OPTIONS, FIXTURES_DIR, _check, run_autoaccel, run_ranks, run_script

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

# Appended to the converted script: each rank writes its split, and the samples (by their
# index in the dataset, `x * 64`) its training loader reads.
DUMP = """
with open(f"split{RANK}.json", "w") as f:
    shard = [round(v.item() * 64) for batch, _ in train_loader for v in batch[:, 0]]
    json.dump({"val": list(val_set.indices), "train": list(train_set.indices), "shard": shard}, f)
"""


def test_every_rank_holds_the_same_split(tmp_path):
    shutil.copy(FIXTURES_DIR / "ddp" / "unseeded_split.py", tmp_path / "train.py")
    proc = run_autoaccel(
        "convert", "train.py", *DDP_OPTIONS, "-o", "out.py", "--no-verify", cwd=tmp_path
    )
    _check(proc, "autoaccel convert unseeded_split")
    script = tmp_path / "out.py"
    script.write_text("import json\n" + script.read_text() + DUMP)
    _check(run_ranks(script, [], tmp_path), "torchrun unseeded_split")
    first, second = (json.loads((tmp_path / f"split{r}.json").read_text()) for r in (0, 1))
    assert first["val"] == second["val"] and first["train"] == second["train"]
    assert not set(first["shard"]) & set(second["shard"])
    assert sorted(first["shard"] + second["shard"] + first["val"]) == list(range(64))
    single = run_script(script, cwd=tmp_path)  # plain `python`: one process, as before
    _check(single, "python unseeded_split")
    assert "validation loss" in single.stdout
