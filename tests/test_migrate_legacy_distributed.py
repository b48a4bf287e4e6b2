"""`convert --to ddp` of Horovod, apex.parallel and `torch.distributed.launch` scripts.

`MigrateHorovod` runs on scripts with the set-up block and a DDP wrapper (`run_step`),
`MigrateLaunch` before the set-up block exists (`apply`); the fixtures of
fixtures/legacy_distributed/ go through the whole target. Neither horovod nor apex is
installed: conversion and lint only parse them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_convert_ddp import DDP, SETUP, apply, dedent, imports_of, run_step

from autoaccel.convert.log import ConversionLog
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.transforms.distributed import MigrateHorovod, MigrateLaunch

LEGACY_IMPORTS = ("import horovod", "from horovod", "import apex", "from apex")
LEGACY = Path(__file__).resolve().parent.parent / "fixtures" / "legacy_distributed"
HOROVOD = "import horovod.torch as hvd\n"
FP16 = " named_parameters=model.named_parameters(), compression=hvd.Compression.fp16)\n"
WRAPPED = """\
from torch.nn.parallel import DistributedDataParallel as DDP

model = Net()
ddp_model = model
if DISTRIBUTED:
    ddp_model = DDP(model)
"""


def migrate_launch(source: str) -> tuple[str, ConversionLog]:
    """`MigrateLaunch` on `source`, and the log."""
    log = ConversionLog()
    code = apply(MigrateLaunch, dedent(source), DDP, log)
    return code, log


def wrong(log: ConversionLog) -> list[tuple[int | None, str]]:
    return [(s.line, s.reason) for s in log.skipped if s.wrong]


# -- Horovod ------------------------------------------------------------------------------
def test_horovod_place_in_the_job_reads_torchrun_names():
    code, log = run_step(
        MigrateHorovod,
        HOROVOD + WRAPPED + """\
sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
workers = 8 // hvd.local_size()
device = hvd.local_rank()
""",
    )
    assert "hvd" not in code and "horovod" not in code
    assert "DistributedSampler(dataset, num_replicas=WORLD_SIZE, rank=RANK)" in code
    assert "lr=0.1 * WORLD_SIZE" in code
    assert 'workers = 8 // int(os.environ.get("LOCAL_WORLD_SIZE", 1))' in code
    assert "device = LOCAL_RANK" in code
    assert not log.skipped


def test_horovod_init_device_and_broadcasts_go_with_the_if_they_leave_empty():
    code, log = run_step(
        MigrateHorovod,
        HOROVOD
        + """\
hvd.init()
if args.cuda:
    torch.cuda.set_device(hvd.local_rank())
"""
        + WRAPPED
        + """\
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
""",
    )
    assert code == WRAPPED
    notes = " ".join(c.description for c in log.changes)
    assert "`hvd.init()` removed" in notes and "DDP copies rank 0's parameters" in notes


def test_distributed_optimizer_goes_and_fp16_compression_hooks_onto_the_wrapper():
    code, log = run_step(
        MigrateHorovod,
        HOROVOD + WRAPPED + """\
optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=hvd.Compression.fp16,
    backward_passes_per_step=4,
    op=hvd.Average,
)
""",
    )
    assert code == WRAPPED + dedent("""\
        # Horovod's fp16 compression: the gradients travel as float16
        if DISTRIBUTED:
            ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        """)
    description = log.changes[0].description
    assert "`backward_passes_per_step=4`" in description and "no_sync" in description
    assert "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks" in imports_of(
        MigrateHorovod, HOROVOD + WRAPPED + "optimizer = hvd.DistributedOptimizer(optimizer," + FP16
    )


def test_compression_chosen_by_a_flag_hooks_under_that_flag():
    code, _ = run_step(
        MigrateHorovod,
        HOROVOD
        + WRAPPED
        + "compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none\n"
        + "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),"
        + " compression=compression)\n",
    )
    assert "compression =" not in code
    assert code.endswith(
        "if DISTRIBUTED and args.fp16_allreduce:\n"
        "    ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)\n"
    )


def test_optimizer_synchronize_goes():
    code, _ = run_step(
        MigrateHorovod,
        HOROVOD
        + WRAPPED
        + "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())\n"
        + "for x in loader:\n    model(x).backward()\n    optimizer.synchronize()\n    optimizer.step()\n",
    )
    assert "synchronize" not in code and "    optimizer.step()\n" in code


def test_distributed_optimizer_without_compression_leaves_no_hook():
    code, _ = run_step(
        MigrateHorovod,
        HOROVOD
        + WRAPPED
        + "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())\n",
    )
    assert code == WRAPPED


def test_allreduce_averages_or_sums_through_helpers():
    code, _ = run_step(
        MigrateHorovod,
        HOROVOD + WRAPPED + """\
mean = hvd.allreduce(loss, name="loss")
total = hvd.allreduce(correct, op=hvd.Sum)
also_total = hvd.allreduce(correct, average=False)
""",
    )
    assert "mean = average_over_processes(loss)" in code
    assert "total = sum_over_processes(correct)" in code
    assert "also_total = sum_over_processes(correct)" in code
    assert code.startswith("def average_over_processes(tensor):")
    assert "        dist.all_reduce(tensor)\n" in code


@pytest.mark.parametrize(
    ("statement", "reported", "offset"),
    [
        pytest.param("gathered = hvd.allgather(x)\n", "`hvd.allgather`", 0, id="other-function"),
        pytest.param("hvd.allreduce_(x)\n", "`hvd.allreduce_`", 0, id="in-place-allreduce"),
        pytest.param(
            "optimizer = hvd.DistributedOptimizer(optimizer, op=hvd.Adasum)\n",
            "does not average",
            0,
            id="adasum",
        ),
        pytest.param(
            "optimizer = hvd.DistributedOptimizer(optimizer, compression=hvd.Compression.fp16)\n",
            "without a DDP wrapper",
            0,
            id="compression-of-no-model",
        ),
        pytest.param(
            "opt = hvd.DistributedOptimizer(optimizer)\n", "other than", 0, id="other-name"
        ),
        pytest.param(
            "optimizer = hvd.DistributedOptimizer(optimizer)\nwith optimizer.skip_synchronize():\n    pass\n",
            "`optimizer.skip_synchronize` of Horovod's DistributedOptimizer",
            1,
            id="skip-synchronize",
        ),
    ],
)
def test_horovod_use_without_a_rewrite_refuses_and_changes_nothing(statement, reported, offset):
    before = HOROVOD + WRAPPED + "hvd.init()\n"
    code, log = run_step(MigrateHorovod, before + statement)
    assert code == before + statement
    [(line, reason)] = wrong(log)
    assert line == SETUP.count("\n") + before.count("\n") + 1 + offset
    assert reported in reason and "migrate it by hand" in reason
    assert not log.changes


UNSHARDED = """\
import horovod.torch as hvd
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
for x, y in loader:
    model(x).mean().backward()
    optimizer.step()
"""


def test_loader_without_sampler_keeps_horovod_batch_only_per_process():
    [(line, reason)] = wrong(convert_source(UNSHARDED, DDP).log)
    assert line == 5 and "--per-process-batch" in reason
    conversion = convert_source(UNSHARDED, replace(DDP, per_process_batch=True))
    assert not wrong(conversion.log)
    assert "batch_size=32" in conversion.converted and "hvd" not in conversion.converted


# -- torch.distributed.launch and apex.parallel -------------------------------------------
LAUNCH = """\
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
dist.init_process_group(backend="nccl")
torch.cuda.set_device(args.local_rank)
model = Net().cuda()
model = DistributedDataParallel(model, device_ids=[args.local_rank])
"""


def test_local_rank_argument_stays_and_is_read_from_the_environment():
    code, log = migrate_launch(
        LAUNCH + "if args.local_rank == 0:\n    print(dist.get_rank(), dist.get_world_size())\n"
    )
    assert 'parser.add_argument("--local_rank", "--local-rank", type=int, default=0)' in code
    assert "if LOCAL_RANK == 0:\n    print(RANK, WORLD_SIZE)\n" in code
    assert any("old launch commands still work" in c.description for c in log.changes)


def test_local_rank_that_says_not_launched_keeps_saying_it_under_plain_python():
    source = (
        LAUNCH.replace("default=0", "default=-1")
        + "if args.local_rank == -1:\n    model = nn.DataParallel(model)\n"
    )
    code, _ = migrate_launch(source)
    assert "if (LOCAL_RANK if DISTRIBUTED else -1) == -1:" in code


def test_script_set_up_and_wrapper_go_and_module_is_the_model():
    code, _ = migrate_launch(LAUNCH + 'torch.save(model.module.state_dict(), "m.pt")\n')
    assert "init_process_group" not in code and "set_device" not in code
    assert "DistributedDataParallel(" not in code
    assert 'model = Net().cuda()\ntorch.save(model.state_dict(), "m.pt")\n' in code


def test_sampler_that_asks_the_process_group_gets_torchrun_values():
    code, _ = migrate_launch(LAUNCH + "sampler = DistributedSampler(dataset)\n")
    assert "sampler = DistributedSampler(dataset, num_replicas=WORLD_SIZE, rank=RANK)" in code


def test_collectives_run_only_when_distributed():
    code, _ = migrate_launch(LAUNCH + "dist.all_reduce(correct)\ndist.barrier()\n")
    assert code.endswith(
        "if DISTRIBUTED:\n    dist.all_reduce(correct)\nif DISTRIBUTED:\n    dist.barrier()\n"
    )


APEX = """\
import torch
import apex
from apex.parallel import DistributedDataParallel as DDP

model = Net()
if args.sync_bn:
    model = apex.parallel.convert_syncbn_model(model)
if args.distributed:
    torch.distributed.init_process_group(backend="nccl")
    model = DDP(model, delay_allreduce=True)
"""


def test_apex_parallel_becomes_torch():
    code, _ = migrate_launch(APEX)
    assert code == dedent("""\
        import torch

        model = Net()
        if args.sync_bn:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        """)


def test_apex_parallel_use_without_a_rewrite_refuses_and_changes_nothing():
    source = APEX + "reducer = apex.parallel.Reducer(model)\n"
    code, log = migrate_launch(source)
    assert code == source
    [(line, reason)] = wrong(log)
    assert line == source.count("\n") and "`apex.parallel.Reducer`" in reason


def test_apex_amp_left_keeps_the_apex_import():
    code, _ = migrate_launch(APEX + "model, optimizer = apex.amp.initialize(model, optimizer)\n")
    assert "import apex\n" in code and "from apex.parallel" not in code


def test_torchrun_script_is_left_to_init_process_group():
    source = LAUNCH.replace('parser.add_argument("--local_rank", type=int, default=0)\n', "")
    code, log = migrate_launch(source)
    assert code == dedent(source)
    assert (
        "already sets up torch.distributed"
        in convert_source(source + "for x in loader:\n    model(x).sum().backward()\n", DDP)
        .log.skipped[0]
        .reason
    )


# -- the fixtures through the whole target ------------------------------------------------
@pytest.mark.parametrize("name", ["horovod_mnist.py", "apex_parallel.py", "launch_local_rank.py"])
def test_fixture_converts_to_torchrun_without_horovod_or_apex(name):
    conversion = convert_source((LEGACY / name).read_text(), DDP, name)  # checks idempotence too
    assert not wrong(conversion.log)
    code = conversion.converted
    assert not [line for line in code.splitlines() if line.startswith(LEGACY_IMPORTS)]
    assert "dist.init_process_group(backend" in code and "DDP(" in code


@pytest.mark.parametrize("name", ["horovod_mnist.py", "apex_parallel.py", "launch_local_rank.py"])
def test_lint_parses_the_originals(name, cli):
    run = cli("lint", str(LEGACY / name))
    assert run.exit_code in (0, 1), run.stderr
