"""How to start a script converted with `--to ddp`: the lines printed under "Run it:"
and, for `--launcher slurm` / `spawn`, the file written beside the script.

Every launcher starts the same converted script: torchrun (or the generated sbatch or
spawn file) sets `RANK`, `LOCAL_RANK` and `WORLD_SIZE`, which its set-up block reads.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePath

from autoaccel.convert.log import Launcher

RENDEZVOUS_PORT = 29500
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_SBATCH = """\
#!/bin/bash
# Multi-node training of {shown} with SLURM: one torchrun per node, one process per GPU.
#SBATCH --job-name={job}
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00

# The first node of the allocation hosts the rendezvous.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)

srun torchrun \\
    --nnodes="$SLURM_NNODES" \\
    --nproc_per_node=gpu \\
    --rdzv_id="$SLURM_JOB_ID" \\
    --rdzv_backend=c10d \\
    --rdzv_endpoint="$head_node:{port}" \\
    {quoted} "$@"
"""

_SPAWN = '''\
"""Start {shown} once per GPU of this machine with torch.multiprocessing.spawn.

    python {spawn} [--nproc N] [{shown}'s arguments]

Each process gets RANK, LOCAL_RANK and WORLD_SIZE in its environment, as under torchrun.
"""
import argparse
import multiprocessing
import os
import runpy
import sys

import torch
import torch.multiprocessing as mp

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), {literal})


def run(local_rank, world_size, start_method, argv):
    # Processes started by mp.spawn start their own children (DataLoader workers) with
    # "spawn" too, which re-runs the script in every worker. Use the start method the
    # script has under torchrun or plain python instead.
    multiprocessing.set_start_method(start_method, force=True)
    os.environ.update(
        RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size)
    )
    sys.argv = [SCRIPT, *argv]
    runpy.run_path(SCRIPT, run_name="__main__")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nproc", type=int, default=torch.cuda.device_count() or 2, help="processes to start"
    )
    args, script_args = parser.parse_known_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "{port}")
    start_method = multiprocessing.get_start_method()
    mp.spawn(run, args=(args.nproc, start_method, script_args), nprocs=args.nproc)
'''


def shell_word(path: str) -> str:
    """`path` as one word of a shell command that no program reads as an option: quoted
    for the shell (a file `$(touch X).py` is a name, not a command) and, when it starts
    with a dash, prefixed with `./` (`python -x.py` would run `python -x`)."""
    return shlex.quote(f"./{path}" if path.startswith("-") else path)


def companion_files(script: str, launcher: Launcher) -> dict[str, str]:
    """Files to write beside the converted script: name -> text. The script's name
    is a shell word in the sbatch file (see `shell_word`) and a Python string in the
    spawn file."""
    name, stem = PurePath(script).name, PurePath(script).stem
    if launcher == "slurm":
        job = re.sub(r"[^\w.-]", "_", stem)
        text = _SBATCH.format(
            shown=in_comment(name), job=job, quoted=shell_word(name), port=RENDEZVOUS_PORT
        )
        return {f"{stem}.sbatch": text}
    if launcher == "spawn":
        spawn = f"spawn_{name}"
        text = _SPAWN.format(
            shown=_in_docstring(name),
            spawn=_in_docstring(spawn),
            literal=repr(name),
            port=RENDEZVOUS_PORT,
        )
        return {spawn: text}
    return {}


def in_comment(name: str) -> str:
    """`name` for a comment: a newline in it would end the comment."""
    return _CONTROL.sub("?", name)


def _in_docstring(name: str) -> str:
    """`name` inside a triple-quoted string, which a quote or backslash could end."""
    return in_comment(name).replace("\\", "\\\\").replace('"', '\\"')


def launch_lines(script: str, launcher: Launcher) -> list[str]:
    """Shell lines that start the converted script, with a comment line before each."""
    name, stem = PurePath(script).name, PurePath(script).stem
    quoted = shell_word(name)
    single = ["# one process, as before:", f"python {quoted}"]
    if launcher == "slurm":
        sbatch = f"{stem}.sbatch"
        return [
            f"# several nodes with SLURM (edit the #SBATCH lines of {in_comment(sbatch)} first):",
            f"sbatch {shell_word(sbatch)}",
            *single,
        ]
    if launcher == "spawn":
        spawn = shell_word(f"spawn_{name}")
        return [
            "# this machine, one process per GPU (torch.multiprocessing.spawn):",
            f"python {spawn}",
            "# without GPUs (gloo), e.g. 2 processes:",
            f"python {spawn} --nproc 2",
            *single,
        ]
    return [
        "# this machine, one process per GPU:",
        f"torchrun --standalone --nproc_per_node=gpu {quoted}",
        "# without GPUs (gloo), e.g. 2 processes:",
        f"torchrun --standalone --nproc_per_node=2 {quoted}",
        *single,
    ]
