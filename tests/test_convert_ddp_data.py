"""`convert --to ddp` and the data pipeline: workers per process, weighted samplers."""

from __future__ import annotations

import pytest
from test_convert_ddp import DDP, TOP_LEVEL, dedent, run_step

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.transforms.distributed import (
    ReplaceDataParallel,
    ShardTrainLoader,
    ShareNodeCpus,
)

WHOLE_NODE = "min(8, os.cpu_count() or 1)"
LOADER_WITH_WORKERS = TOP_LEVEL.replace(
    "shuffle=True)", f"shuffle=True, num_workers={WHOLE_NODE}, persistent_workers=True)"
).replace("import torch\n", "import os\n\nimport torch\n", 1)


# -- workers per process ------------------------------------------------------------------
def test_workers_share_the_node_cpus_among_its_processes():
    code, log = run_step(ShareNodeCpus, LOADER_WITH_WORKERS)
    assert code.startswith(dedent("""\
            # DataLoader workers: the processes on this node share its CPUs.
            LOCAL_WORLD_SIZE = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
            CPUS_PER_PROCESS = max(1, (os.cpu_count() or 1) // LOCAL_WORLD_SIZE)
            """))
    assert "num_workers=min(8, CPUS_PER_PROCESS)" in code
    assert WHOLE_NODE not in code
    assert "LOCAL_WORLD_SIZE" in log.changes[0].description


def test_workers_the_script_chose_are_kept():
    source = LOADER_WITH_WORKERS.replace(WHOLE_NODE, "4")
    code, log = run_step(ShareNodeCpus, source)
    assert "num_workers=4" in code
    assert "CPUS_PER_PROCESS" not in code
    assert not log.changes


def test_a_min_of_the_script_is_not_the_builtin():
    source = LOADER_WITH_WORKERS.replace("import os\n", "import os\nfrom mylib import min\n")
    code, _ = run_step(ShareNodeCpus, source)
    assert WHOLE_NODE in code


def test_converted_loader_gets_the_per_process_share_of_workers():
    source = TOP_LEVEL.replace(
        "import torch\n",
        "import torch\nfrom torch.utils.data import Dataset\n\n"
        "class Images(Dataset):\n    def __getitem__(self, i):\n"
        "        return self.augment(self.images[i])\n\n",
        1,
    ).replace("DataLoader(dataset,", "DataLoader(Images(),")
    code = convert_source(source, DDP).converted
    assert "num_workers=min(8, CPUS_PER_PROCESS)" in code
    assert (
        convert_source(source, ConvertOptions(target="single", amp="off")).converted.count(
            WHOLE_NODE
        )
        == 1
    )


# -- weighted samplers ----------------------------------------------------------------------
WEIGHTED = TOP_LEVEL.replace(
    "from torch.utils.data import DataLoader\n",
    "from torch.utils.data import DataLoader, WeightedRandomSampler\n\n"
    "weighted = WeightedRandomSampler(weights, num_samples=len(weights))\n",
).replace("shuffle=True", "sampler=weighted")


@pytest.mark.parametrize(
    "source",
    [
        WEIGHTED,
        WEIGHTED.replace(
            "from torch.utils.data import DataLoader, WeightedRandomSampler\n",
            "from torch.utils.data import DataLoader\n"
            "from torch.utils.data.sampler import WeightedRandomSampler\n",
        ).replace("num_samples=len(weights)", "len(weights)"),
    ],
    ids=["torch.utils.data", "torch.utils.data.sampler"],
)
def test_weighted_sampler_keeps_its_weights_and_each_process_reads_its_share(source):
    """Also imported from its own module with a positional count (pytorch-speech-commands,
    the tenth unseen set: refused as "already has a sampler")."""
    code, log = run_step(ShardTrainLoader, source)
    assert "class ShardedDraws(torch.utils.data.Sampler):" in code
    assert "sampler=ShardedDraws(weighted) if DISTRIBUTED else weighted," in code
    assert "batch_size=per_process_batch_size(32)," in code
    assert "DistributedSampler(" not in code
    assert "keeps its weights" in log.changes[0].description
    assert not log.skipped


def test_weighted_sampler_built_in_the_call_is_named_first():
    source = WEIGHTED.replace("sampler=weighted", "sampler=WeightedRandomSampler(w, 64)")
    code, _ = run_step(ShardTrainLoader, source)
    assert "sampler = WeightedRandomSampler(w, 64)\nloader = DataLoader(" in code
    assert "sampler=ShardedDraws(sampler) if DISTRIBUTED else sampler," in code


@pytest.mark.runs
@pytest.mark.parametrize("replacement", [True, False])
def test_processes_read_one_weighted_draw_between_them(replacement):
    """Run the inserted class as two ranks would: together they read one draw of the
    original sampler (the same generator seed), each an equal share."""
    torch = pytest.importorskip("torch")
    helper = run_step(ShardTrainLoader, WEIGHTED)[0].split("class ShardedDraws", 1)[1]
    helper = "class ShardedDraws" + helper.split("\n\n\n", 1)[0]
    weights = torch.tensor([1.0] * 90 + [9.0] * 10)
    shares = []
    for rank in range(2):
        scope = {"torch": torch, "RANK": rank, "WORLD_SIZE": 2, "dist": _OneProcessGroup()}
        exec(helper, scope)
        torch.manual_seed(rank)  # each process's global RNG differs (re-seeded by rank)
        original = torch.utils.data.WeightedRandomSampler(weights, 75, replacement=replacement)
        shares.append(list(scope["ShardedDraws"](original)))
    assert len(shares[0]) == len(shares[1]) == 38  # 75 padded to 76
    draw = [i for pair in zip(*shares) for i in pair][:75]
    expected = torch.utils.data.WeightedRandomSampler(
        weights, 75, replacement=replacement, generator=torch.Generator().manual_seed(_SEED)
    )
    assert draw == list(expected)
    if not replacement:
        assert len(set(draw)) == 75


_SEED = 1234


class _OneProcessGroup:
    """`dist.broadcast` as rank 0's seed reaching every rank."""

    def broadcast(self, tensor, src):
        tensor.fill_(_SEED)


# -- checkpoints saved under nn.DataParallel ------------------------------------------------
def test_loading_into_an_unwrapped_model_strips_the_data_parallel_prefix():
    source = TOP_LEVEL.replace(
        "model = nn.Linear(4, 2)\n",
        "model = nn.Linear(4, 2)\nmodel = nn.DataParallel(model)\n"
        "model.load_state_dict(torch.load(path))\n",
    )
    code, log = run_step(ReplaceDataParallel, source)
    assert dedent("""\
        model = nn.Linear(4, 2)
        state_dict = torch.load(path)
        # a checkpoint saved under nn.DataParallel names its keys `module.*`
        torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state_dict, "module.")
        model.load_state_dict(state_dict)
        """) in code
    assert any("prefix stripped" in c.description for c in log.changes)


def test_loading_a_named_state_dict_strips_it_in_place():
    source = TOP_LEVEL.replace(
        "model = nn.Linear(4, 2)\n",
        "model = nn.Linear(4, 2)\nmodel = nn.DataParallel(model)\n"
        'model.load_state_dict(checkpoint["model"])\n',
    )
    code, _ = run_step(ReplaceDataParallel, source)
    assert 'checkpoint["model"], "module."\n)\nmodel.load_state_dict(checkpoint["model"])' in code
    assert "state_dict =" not in code
