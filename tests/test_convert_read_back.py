"""A file rank 0 alone writes, read back by every rank (bench31 S4: a GPT repository
writes config.json, then sample.py's loader reads it on every rank). The read waits at
a barrier when a write the conversion put on rank 0 (or a `torch.save`) runs before it
in its function, also when the read is in a function of another module of the project;
never where only some ranks, or a number of times that differs between ranks, reach it.
Run under torchrun by tests/test_convert_read_back_runs.py."""

from __future__ import annotations

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.convert.transforms.distributed import LoadOnEveryRank
from autoaccel.fileio import read_source
from running import FIXTURES_DIR
from test_convert_ddp import SETUP, dedent, run_step

SCRIPT = FIXTURES_DIR / "ddp" / "read_back_config" / "train.py"
BARRIER = "if DISTRIBUTED:\n    dist.barrier()  # rank 0 may still be writing it\n"


def converted() -> dict[str, str]:
    project = find_project(SCRIPT, read_source(SCRIPT))
    assert project is not None
    result = convert_project(project, ConvertOptions(target="ddp", amp="off"), "train.py")
    return {file.file.path.name: file.conversion.converted for file in result.files}


def test_every_rank_waits_before_sample_py_reads_what_rank_zero_saved():
    train = converted()["train.py"]
    assert (
        '    save_run(model, config, "run")\n'
        "    if DISTRIBUTED:\n"
        "        dist.barrier()  # rank 0 may still be writing it\n"
        '    tokens = generate(model, "run", device)\n'
    ) in train
    assert train.count("dist.barrier()") == 1  # not before `main()`: a definition writes nothing


def test_a_json_file_read_after_a_rank_zero_write_waits():
    code, log = run_step(
        LoadOnEveryRank,
        """\
        if RANK == 0:
            json.dump(config, open("config.json", "w"))
        with open("config.json") as f:
            config = json.load(f)
        """,
    )
    assert code.endswith(BARRIER + 'with open("config.json") as f:\n    config = json.load(f)\n')
    assert [c.description for c in log.changes] == [
        "barrier before reading: every rank waits for rank 0's write"
    ]


def test_a_read_before_the_write_or_on_rank_zero_does_not_wait():
    body = """\
        def save(config):
            if RANK == 0:
                json.dump(config, open("config.json", "w"))


        config = json.load(open("defaults.json"))
        save(config)
        if RANK == 0:
            print(open("config.json").read())
        """
    assert "barrier" not in run_step(LoadOnEveryRank, body)[0]


def test_a_read_in_a_while_loop_is_refused_with_its_line():
    """The ranks may run a `while` loop a different number of times: a barrier in it
    could hang."""
    body = """\
        while not done():
            if RANK == 0:
                json.dump(state, open("state.json", "w"))
            state = json.load(open("state.json"))
        """
    code, log = run_step(LoadOnEveryRank, body)
    assert "barrier" not in code
    (refused,) = log.skipped
    assert refused.what == "dist.barrier" and refused.wrong
    read = '    state = json.load(open("state.json"))'
    assert refused.line == (SETUP + dedent(body)).splitlines().index(read) + 1
