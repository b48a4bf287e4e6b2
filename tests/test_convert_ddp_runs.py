"""Proof by running: `convert --to ddp` trains every fixture on two processes (gloo, CPU).

Each fixture is converted with `--to ddp --amp off`, then run three ways:

* the original, under `autoaccel.run.harness` (the loss of every backward call);
* the conversion with plain `python`: one process, so it must train like the original
  (same comparison as tests/test_convert_runs.py for `--amp off`);
* the conversion under `torchrun --standalone --nproc_per_node=2`, through a probe that
  records, per rank, the dataset indices its `DistributedSampler` yields and every
  `torch.save` call. Both ranks must finish, read disjoint halves of the training data
  every epoch, take as many steps as the original (the global batch is kept), only
  rank 0 may save, and the final loss must stay close to the original's.

`linear_exact.py` (unshuffled, no dropout, no BatchNorm) proves exact equivalence: two
processes with 16 samples each average to the gradient of the original's batch of 32, so
the final parameters equal the original's to float rounding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import Future
from pathlib import Path

import pytest

from running import (
    DDP_OPTIONS,
    FIXTURES_DIR,
    TIMEOUT_S,
    SessionRuns,
    _check,
    _env,
    convert,
    free_port,
    run_ranks,
    runs_fixture,
    selected,
)
from test_convert_runs import CASES, EXACT_REL, final_loss, rel_gap

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.runs

WORLD_SIZE = 2
# Fixtures whose data no DistributedSampler reads: a weighted sampler each process reads a
# share of (tests/test_convert_data_runs.py checks what they read), and token streams
# split by column (tests/test_convert_tensor_data_runs.py checks them).
NO_SAMPLER = {"imbalanced_resume.py", "lstm_lm.py"}
# Final-loss gap allowed between two ranks' mean (last epoch) and the original's: the
# DistributedSampler shuffles with its own generator, and from the start of training each
# rank draws its own random numbers (re-seeded with seed + RANK), so a fixture sees other
# batches and dropout masks, as with another seed. Measured gaps (2 epochs, 2-core CPU,
# torch 2.13): cnn_toplevel 1.47 %, dataparallel_existing 3.98 %, gan 0.16 %, resnet_cifar
# 5.39 %, trainer_class 0.43 %, transformer_accum 5.31 %, transformer_lm 0.04 %, trainer_methods 6.71 %;
# mnist_main 12.7 % (dropout + Adadelta at lr 1.0: its second epoch falls steeply, so a
# step's noise moves the mean a lot); linear_exact and lstm_lm 0.
DDP_TOL = {name: 0.15 for name in CASES}
# step_functions 11.1 %: each rank's loss is the focal loss (~0.06 by epoch 2) of a
# 16-sample half batch, so one batch's noise moves the rank's mean by tens of percent.
DDP_TOL.update(
    {"mnist_main.py": 0.3, "step_functions.py": 0.3, "linear_exact.py": 1e-4, "lstm_lm.py": 1e-4}
)

PROBE = textwrap.dedent("""\
    # Run a script under `python -m autoaccel.run.harness` (losses-<rank>.json) and write
    # probe-<rank>.json: the indices every DistributedSampler pass yielded and the files
    # torch.save wrote.
    import json
    import os
    import sys

    import torch
    from torch.utils.data import DistributedSampler

    from autoaccel.run import harness

    probe = {"passes": [], "saves": []}
    sampler_iter, save = DistributedSampler.__iter__, torch.save


    def recording_iter(self):
        indices = list(sampler_iter(self))
        probe["passes"].append({"epoch": self.epoch, "size": len(self.dataset), "indices": indices})
        return iter(indices)


    def recording_save(obj, f, *args, **kwargs):
        probe["saves"].append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else f.name)
        return save(obj, f, *args, **kwargs)


    DistributedSampler.__iter__ = recording_iter
    torch.save = recording_save
    status = harness.main(["--losses-out", "losses-{rank}.json", *sys.argv[1:]])
    with open(f"probe-{os.environ['RANK']}.json", "w") as out:
        json.dump(probe, out)
    sys.exit(status)
    """)


def run_torchrun(script: Path, args: tuple[str, ...], cwd: Path) -> list[dict]:
    """`torchrun --nproc_per_node=2 probe.py script args` in `cwd`; one probe per rank."""
    probe = cwd / "probe.py"
    probe.write_text(PROBE)
    proc = run_ranks(probe, (script, *args), cwd, WORLD_SIZE)
    _check(proc, f"torchrun {script.name}")
    return [
        {
            **json.loads((cwd / f"probe-{rank}.json").read_text()),
            **json.loads((cwd / f"losses-{rank}.json").read_text()),
        }
        for rank in range(WORLD_SIZE)
    ]


def _job(shared: SessionRuns, name: str) -> dict:
    args = CASES[name].args
    converted = shared.convert(name, *DDP_OPTIONS)
    folder = shared.folder(f"ddp-{name.removesuffix('.py')}")
    return {
        "orig": shared.run(FIXTURES_DIR / name, args).losses,
        "python": shared.run(converted, args).losses,
        "ranks": run_torchrun(converted, args, folder),
        "cwd": folder,  # where the ranks ran (and rank 0 saved)
    }


def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
    """Each selected fixture's runs, in the background (see running.py); tests without a
    `name` that use these runs read linear_exact.py's."""
    tests = [test for test in tests if "ddp_runs" in test.fixturenames]
    return {name: shared.start(_job, name) for name in selected(tests, default="linear_exact.py")}


ddp_runs = runs_fixture(start_runs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_python_trains_like_the_original(name, ddp_runs):
    case = CASES[name]
    runs = ddp_runs[name].result()
    orig, single = runs["orig"], runs["python"]
    assert len(single) == len(orig)
    exact = case.steps_per_epoch if case.rng_shifts else len(orig)
    for step, (a, b) in enumerate(zip(orig[:exact], single[:exact])):
        assert b == pytest.approx(a, rel=EXACT_REL), f"step {step}: original {a}, converted {b}"
    if case.rng_shifts:
        gap = rel_gap(final_loss(orig, case), final_loss(single, case))
        assert gap <= case.off_tol, f"final loss differs by {gap:.2%}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_processes_train_on_disjoint_halves(name, ddp_runs):
    case = CASES[name]
    runs = ddp_runs[name].result()
    ranks = runs["ranks"]
    assert [r["exit"] for r in ranks] == ["ok", "ok"]
    for rank in ranks:
        assert len(rank["losses"]) == len(runs["orig"]), "the global batch changed"
    if name in NO_SAMPLER:
        assert not ranks[0]["passes"]
    else:
        assert len(ranks[0]["passes"]) == len(ranks[1]["passes"]) >= 2
        for first, second in zip(ranks[0]["passes"], ranks[1]["passes"]):
            assert first["epoch"] == second["epoch"]
            assert not set(first["indices"]) & set(second["indices"])
            assert set(first["indices"]) | set(second["indices"]) == set(range(first["size"]))
        epochs = [p["epoch"] for p in ranks[0]["passes"]]
        assert epochs == sorted(set(epochs)), "set_epoch is not called every epoch"
    ddp_final = sum(final_loss(r["losses"], case) for r in ranks) / len(ranks)
    gap = rel_gap(final_loss(runs["orig"], case), ddp_final)
    assert gap <= DDP_TOL[name], f"final loss differs by {gap:.2%}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_only_rank_zero_saves(name, ddp_runs):
    ranks = ddp_runs[name].result()["ranks"]
    assert ranks[0]["saves"], "rank 0 saved nothing"
    assert ranks[1]["saves"] == []


def run_spawn_launcher(script: Path, args: tuple[str, ...], cwd: Path) -> None:
    """`python spawn_SCRIPT --nproc 2 args`: the file `--launcher spawn` writes beside it."""
    proc = subprocess.run(
        [
            sys.executable,
            str(script.with_name(f"spawn_{script.name}")),
            "--nproc",
            str(WORLD_SIZE),
            *args,
        ],
        cwd=cwd,
        env=_env({"MASTER_PORT": str(free_port())}),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    _check(proc, f"spawn_{script.name}")


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_two_processes_reach_the_original_parameters(tmp_path, session_runs, ddp_runs, launcher):
    """Global batch 32 = 2 processes x 16: after 2 epochs the parameters are the same.
    With `--launcher spawn`, the script's DataLoader workers must not re-run it (they
    would if they inherited mp.spawn's start method): the run would hang or fail.
    torchrun (the default launcher): the module's own run of the conversion."""
    name = "linear_exact.py"
    args = CASES[name].args  # --save-params params.pt
    original = session_runs.run(FIXTURES_DIR / name, args).check()
    if launcher == "spawn":
        converted = convert(name, tmp_path, *DDP_OPTIONS, "--launcher", launcher)
        folder = tmp_path / "ddp"
        folder.mkdir()
        run_spawn_launcher(converted, args, folder)
    else:
        folder = ddp_runs[name].result()["cwd"]
    expected = torch.load(original.cwd / "params.pt")
    distributed = torch.load(folder / "params.pt")
    assert expected.keys() == distributed.keys()  # no `module.` prefix
    for key, value in expected.items():
        assert torch.allclose(distributed[key], value, rtol=1e-5, atol=1e-6), key


def test_legacy_script_runs_on_two_processes(tmp_path, session_runs):
    converted = session_runs.convert("legacy_pytorch03.py", *DDP_OPTIONS)
    ranks = run_torchrun(converted, (), tmp_path)
    assert [len(r["losses"]) for r in ranks] == [16, 16]  # 2 epochs x 8 batches of 16
    assert ranks[1]["saves"] == [] and ranks[0]["saves"] == ["legacy_model.pth"]


def test_sbatch_file_runs_on_a_one_node_allocation(tmp_path, session_runs):
    """The `--launcher slurm` file, run by bash as sbatch would on a 1-node allocation:
    `srun` and `scontrol` are stand-ins that run the command here and name this host.
    Two changes, because this machine has no GPU and shares its ports: 2 processes
    instead of `--nproc_per_node=gpu`, and a free rendezvous port."""
    name = "linear_exact.py"
    args = CASES[name].args  # --save-params params.pt
    converted = convert(name, tmp_path, *DDP_OPTIONS, "--launcher", "slurm")
    sbatch = converted.with_suffix(".sbatch")
    text = sbatch.read_text()
    assert "--nproc_per_node=gpu" in text and ":29500" in text
    sbatch.write_text(
        text.replace("--nproc_per_node=gpu", f"--nproc_per_node={WORLD_SIZE}")
        .replace(":29500", f":{free_port()}")
        .replace("srun torchrun", f"srun {sys.executable} -m torch.distributed.run")
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nexec "$@"\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    original = session_runs.run(FIXTURES_DIR / name, args).check()
    allocation = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node001", "SLURM_NNODES": "1", "SLURM_JOB_ID": "4242",
    }  # fmt: skip
    proc = subprocess.run(
        ["bash", str(sbatch), *args],
        cwd=tmp_path,
        env=_env(allocation),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    _check(proc, sbatch.name)
    expected = torch.load(original.cwd / "params.pt")
    distributed = torch.load(tmp_path / "params.pt")
    for key, value in expected.items():
        assert torch.allclose(distributed[key], value, rtol=1e-5, atol=1e-6), key
