"""`convert --to ddp` and the data pipeline: workers per process, weighted samplers."""

from __future__ import annotations

from test_convert_ddp import DDP, TOP_LEVEL, dedent, run_step

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.transforms.distributed import ShareNodeCpus

WHOLE_NODE = "min(8, os.cpu_count() or 1)"
LOADER_WITH_WORKERS = TOP_LEVEL.replace(
    "shuffle=True)", f"shuffle=True, num_workers={WHOLE_NODE}, persistent_workers=True)"
).replace("import torch\n", "import os\n\nimport torch\n", 1)


# -- workers per process ------------------------------------------------------------------
def test_workers_share_the_node_cpus_among_its_processes():
    code, log = run_step(ShareNodeCpus, LOADER_WITH_WORKERS)
    assert code.startswith(
        dedent(
            """\
            # DataLoader workers: the processes on this node share its CPUs.
            LOCAL_WORLD_SIZE = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
            CPUS_PER_PROCESS = max(1, (os.cpu_count() or 1) // LOCAL_WORLD_SIZE)
            """
        )
    )
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
    assert convert_source(source, ConvertOptions(target="single", amp="off")).converted.count(WHOLE_NODE) == 1
