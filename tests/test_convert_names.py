"""The names a conversion inserts never take over the script's own: where the script
uses one (in any scope, through a star import, as a loop, `except` or `with` target, a
`del`, a `def` or `class`), the conversion's code gets a free name instead."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from textwrap import dedent

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

DDP = ConvertOptions(target="ddp", amp="off")
FSDP = ConvertOptions(target="fsdp", amp="off")
DP = ConvertOptions(target="dp", amp="off")
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

TRAINS = dedent("""\
    import torch
    from torch.utils.data import DataLoader
    {extra}
    loader = DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in loader:
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), "model.pt")
    """)


def converted(extra: str, options: ConvertOptions = DDP, path: str = "<string>") -> str:
    """The conversion of `TRAINS` with `extra` after its imports; it must keep the
    lines of `extra` (its imports may move among the others)."""
    code = convert_source(TRAINS.format(extra=extra), options, path).converted
    assert all(line.strip() in code for line in extra.splitlines())
    return code


def binds(code: str, name: str) -> bool:
    """Whether `code` binds `name` at the start of a line (`name = `, `def name(`, ...)."""
    return re.search(rf"^\s*(?:def |class )?{re.escape(name)}\b\s*[=(:]", code, re.M) is not None


@pytest.mark.parametrize(
    ("extra", "name", "fresh"),
    [
        ("RANK = 3", "RANK", "RANK2"),
        ("WORLD_SIZE = 1", "WORLD_SIZE", "WORLD_SIZE2"),
        ("DISTRIBUTED = False", "DISTRIBUTED", "DISTRIBUTED2"),
        ("import torch.distributions as dist", "dist", "torch_dist"),
        ("for dist in range(2):\n    pass", "dist", "torch_dist"),
        ("try:\n    pass\nexcept ValueError as dist:\n    pass", "dist", "torch_dist"),
        (
            "import contextlib\nwith contextlib.nullcontext() as dist:\n    pass",
            "dist",
            "torch_dist",
        ),
        ("def dist(a, b):\n    return a - b", "dist", "torch_dist"),
        ("warnings = []", "warnings", "warnings2"),
        ("gc = 'garbage'", "gc", "gc2"),
        ("from other_library import DDP", "DDP", "DDP2"),
    ],
)
def test_a_name_the_script_uses_gets_a_fresh_one_in_the_inserted_code(extra, name, fresh):
    code = converted(extra)
    assert fresh in code
    assert "Renamed, the script has these names already:" in code
    assert f"{name} -> {fresh}" in code


def test_the_set_up_block_names_are_renamed_where_they_are_defined_and_read():
    code = converted("RANK = 3\nWORLD_SIZE = 16")
    assert 'RANK2 = int(os.environ.get("RANK", 0))' in code
    assert 'WORLD_SIZE2 = int(os.environ.get("WORLD_SIZE", 1))' in code
    assert "if RANK2 == 0:" in code and "loss * WORLD_SIZE2" in code
    assert "if RANK == 0" not in code


def test_an_import_of_a_renamed_module_name_gets_as():
    code = converted("warnings = []")
    assert "import warnings as warnings2" in code and "warnings2.warn(" in code


def test_a_dist_deleted_later_is_not_the_conversions():
    code = converted("import torch.distributed as dist\nx = 1\ndel dist")
    assert "import torch.distributed as torch_dist" in code
    assert "torch_dist.destroy_process_group()" in code


def test_a_wrapper_name_the_script_uses_gets_a_fresh_one():
    code = converted("ddp_model = 'mine'")
    assert "ddp_model2 = DDP(" in code and "loss = ddp_model2(x)" in code


def test_hoisted_dataset_and_sampler_avoid_the_scripts_functions():
    code = converted("def dataset():\n    return 1\n\n\ndef sampler():\n    return 2")
    assert "dataset2 = torch.utils.data.TensorDataset" in code
    assert "sampler2 = DistributedSampler(dataset2" in code


def test_an_attribute_or_keyword_of_an_inserted_name_is_no_clash():
    code = converted("print(len(torch.utils.data.TensorDataset().dataset), dict(sampler=1))")
    assert "dataset = torch.utils.data.TensorDataset" in code
    assert "sampler = DistributedSampler(dataset" in code


def test_a_name_from_a_star_import_of_unknown_names_counts_where_the_script_reads_it():
    code = converted("from settings import *\nprint(RANK, WORLD_SIZE)")
    assert "RANK2 = int(" in code and "WORLD_SIZE2 = int(" in code
    assert "print(RANK, WORLD_SIZE)" in code


def test_a_star_import_of_a_module_beside_the_script_is_read(tmp_path):
    (tmp_path / "settings.py").write_text("LOCAL_RANK = 5\n")
    code = converted("from settings import *", path=str(tmp_path / "train.py"))
    assert "LOCAL_RANK2 = int(" in code and "device_ids=[LOCAL_RANK2]" in code


@pytest.mark.parametrize("options", [DDP, DP], ids=["ddp", "dp"])
def test_a_late_star_import_of_unknown_names_is_refused(options):
    conversion = convert_source(TRAINS.format(extra="x = 1\nfrom settings import *"), options)
    assert "init_process_group" not in conversion.converted
    assert "ModelWithLoss" not in conversion.converted
    assert any("`import *`" in item.reason and item.wrong for item in conversion.log.skipped)


def test_a_user_nowriter_class_is_kept_apart():
    source = (FIXTURES / "ddp" / "tensorboard_logs.py").read_text()
    extra = "\n\nclass NoWriter:\n    def __init__(self, path):\n        self.path = path\n"
    code = convert_source(source + extra, DDP).converted
    assert "else NoWriter2(log_dir=" in code and binds(code, "class NoWriter2")
    assert extra in code


def test_a_user_shardeddraws_function_is_kept_apart():
    source = (FIXTURES / "imbalanced_resume.py").read_text()
    extra = "\n\ndef ShardedDraws(x):\n    return x\n"
    code = convert_source(source + extra, DDP).converted
    assert "ShardedDraws2(" in code and extra in code


def test_a_user_all_reduce_sums_is_kept_apart():
    source = (FIXTURES / "resnet_cifar.py").read_text()
    extra = "\n\ndef all_reduce_sums(x):\n    return x\n"
    code = convert_source(source + extra, DDP).converted
    assert "def all_reduce_sums2(" in code and "all_reduce_sums2(" in code and extra in code


@pytest.mark.parametrize("name", ["full_state_dict", "fully_shard", "shard_model"])
def test_fsdp_helpers_avoid_the_scripts_names(name):
    code = converted(f"def {name}(x):\n    return x", FSDP)
    assert f"{name}2" in code


def test_dp_wrapper_class_avoids_the_scripts_class():
    source = (FIXTURES / "cnn_toplevel.py").read_text()
    extra = "\n\nclass ModelWithLoss:\n    def __init__(self, x):\n        self.x = x\n"
    code = convert_source(source + extra, DP).converted
    assert "class ModelWithLoss2(" in code and "= ModelWithLoss2(" in code and extra in code


@pytest.mark.parametrize("options", [DDP, FSDP, DP], ids=["ddp", "fsdp", "dp"])
def test_a_script_without_clashes_gets_no_renames(options):
    code = converted("", options)
    assert "Renamed" not in code


def test_a_converted_script_with_renames_converts_to_itself():
    code = converted("import torch.distributions as dist\nRANK = 3")
    assert convert_source(code, DDP).converted == code


@pytest.mark.parametrize(
    "module",
    [
        "autoaccel.convert.transforms.inserted_names",
        "autoaccel.convert.transforms.data_parallel",
        "autoaccel.convert.transforms.distributed",
        "autoaccel.convert.transforms.fully_sharded",
    ],
)
def test_each_target_s_steps_import_first_in_a_fresh_process(module):
    """`--to dp` imports inserted_names before the ddp steps that import it: no cycle."""
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
