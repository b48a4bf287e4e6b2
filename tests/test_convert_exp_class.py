"""Issue 29 (Informer's experiment classes): fixtures/facts/exp_base_class/, where the
base class of exp_basic.py builds `self.model` and `train()` of exp_model.py keeps the
best model with `EarlyStopping` of tools.py, whose `__call__` counts the epochs without
progress and, on progress, `torch.save`s the model it is given; `train()` then loads it.

`--to ddp` converts tools.py with the training code: `save_checkpoint()` writes on rank 0
only (a guard of the `early_stopping(...)` call would skip its counting on the other ranks),
and every rank waits at a barrier before it loads rank 0's checkpoint. Before, every
process wrote the checkpoint and another could load it half-written: the parameters
differed after training. tests/test_convert_exp_class_runs.py proves the result.
"""

from __future__ import annotations

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.fileio import read_source
from running import FIXTURES_DIR

SCRIPT = FIXTURES_DIR / "facts" / "exp_base_class" / "main.py"


def converted() -> dict[str, str]:
    project = find_project(SCRIPT, read_source(SCRIPT))
    assert project is not None
    result = convert_project(project, ConvertOptions(target="ddp", amp="off"), str(SCRIPT))
    return {f.file.path.name: f.conversion.converted for f in result.files}


def test_early_stopping_saves_on_rank_zero_and_keeps_counting_on_every_rank():
    texts = converted()
    assert (
        "    def save_checkpoint(self, model, path):\n"
        "        if RANK != 0:\n"
        "            return  # only rank 0 writes\n"
        '        print(f"validation loss {self.best:.4f}: saving the model")\n'
        '        torch.save(model.state_dict(), path + "/checkpoint.pth")\n'
    ) in texts["tools.py"]
    assert 'RANK = int(os.environ.get("RANK", 0))' in texts["tools.py"]
    # the call itself runs on every rank: its counting decides the `break`, which every
    # rank then takes together (each may count from a validation loss of its own)
    assert (
        "            early_stopping(vali_loss, self.model, path)\n"
        "            if on_any_rank(early_stopping.early_stop):\n"
    ) in texts["exp_model.py"]


def test_every_rank_loads_the_checkpoint_after_a_barrier():
    text = converted()["exp_model.py"]
    assert (
        "        if DISTRIBUTED:\n"
        "            dist.barrier()  # rank 0 may still be writing it\n"
        "        self.model.load_state_dict(\n"
    ) in text
