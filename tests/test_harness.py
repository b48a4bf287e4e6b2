"""The harness records what a training script does, without changing the script.

The scripts run in this process (`runpy`), so these tests pay for `import torch` once.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import asdict

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.runs

from autoaccel.run import harness  # noqa: E402
from autoaccel.run.runner import remove_made_folders  # noqa: E402
from autoaccel.tune.capture import capture_loaders  # noqa: E402

TRAIN = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(24, 3), torch.randn(24, 1))
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in DataLoader(data, batch_size=4):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """)


def write(tmp_path, source: str, name: str = "train.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_records_losses_times_and_samples(tmp_path):
    record = harness.record_steps(write(tmp_path, TRAIN), [])
    assert record.exit == "ok"
    assert len(record.losses) == len(record.times) == 12
    assert record.samples == [4 * (i + 1) for i in range(12)]
    assert record.times == sorted(record.times)
    assert record.end_time >= record.times[-1]
    assert record.peak_rss_bytes > 10 * 2**20
    assert record.device == "cpu" and record.torch_version == torch.__version__


def test_max_steps_stops_the_script(tmp_path):
    script = TRAIN + "raise SystemExit('the script ran to its end')\n"
    record = harness.record_steps(write(tmp_path, script), [], max_steps=5)
    assert record.exit == "max-steps"
    assert len(record.losses) == 5


def test_the_script_cannot_swallow_the_stop(tmp_path):
    script = (
        "try:\n" + textwrap.indent(TRAIN, "    ") + "except Exception:\n    raise SystemExit(1)\n"
    )
    record = harness.record_steps(write(tmp_path, script), [], max_steps=3)
    assert record.exit == "max-steps"


def test_a_batch_counts_once_and_evaluation_batches_not_at_all(tmp_path):
    script = TRAIN.replace(
        "        loss.backward()\n",
        "        loss.backward(retain_graph=True)\n        (2 * loss).backward()\n",
    ) + textwrap.dedent(
        """\
        with torch.no_grad():
            for x, y in DataLoader(data, batch_size=6):
                model(x)
        loss = model(x).sum()
        loss.backward()
        """
    )
    record = harness.record_steps(write(tmp_path, script), [])
    assert len(record.losses) == 25
    assert record.losses[1] == pytest.approx(2 * record.losses[0])
    assert record.samples[:4] == [4, 4, 8, 8]
    # The last backward follows batches drawn under `no_grad()`: an evaluation's, never
    # counted (a probe fitted on encoded features trains on no DataLoader batch).
    assert record.samples[-1] == 48


def test_losses_under_grad_scaler_are_unscaled(tmp_path):
    script = TRAIN.replace(
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "scaler = torch.amp.GradScaler('cpu', init_scale=1024.0)\n",
    ).replace("loss.backward()", "scaler.scale(loss).backward()")
    plain = harness.record_steps(write(tmp_path, TRAIN), [], max_steps=1)
    scaled = harness.record_steps(write(tmp_path, script, "scaled.py"), [], max_steps=1)
    assert scaled.losses == pytest.approx(plain.losses)


def test_forced_autocast_enables_regions_the_script_disables_off_cuda(tmp_path, monkeypatch):
    script = TRAIN.replace(
        "loss = torch.nn.functional.mse_loss(model(x), y)",
        "with torch.autocast('cpu', dtype=torch.bfloat16, enabled=False):\n"
        "                loss = torch.nn.functional.mse_loss(model(x), y)",
    )
    path = write(tmp_path, script)
    plain = harness.record_steps(write(tmp_path, TRAIN, "plain.py"), [], max_steps=2)
    assert harness.record_steps(path, [], max_steps=2).losses == plain.losses
    monkeypatch.setenv(harness.FORCE_AUTOCAST_ENV, "1")
    forced = harness.record_steps(path, [], max_steps=2)
    assert forced.losses != plain.losses  # bf16 rounds
    assert forced.losses == pytest.approx(plain.losses, rel=0.02)
    with torch.autocast("cpu", enabled=False):
        assert not torch.is_autocast_enabled("cpu")  # the patch ends with the run


def test_only_a_missing_bf16_kernel_under_forced_autocast_gets_a_note(monkeypatch):
    missing = RuntimeError("could not create a primitive descriptor for the LSTM forward")
    assert harness._missing_bf16_kernel(missing) == ""  # autocast not forced
    monkeypatch.setenv(harness.FORCE_AUTOCAST_ENV, "1")
    assert harness._missing_bf16_kernel(RuntimeError("shape mismatch")) == ""
    assert "no bf16 kernel for an operation" in harness._missing_bf16_kernel(missing)


def test_seed_makes_unseeded_scripts_repeatable(tmp_path):
    script = write(tmp_path, TRAIN.replace("torch.manual_seed(0)\n", ""))
    first = harness.record_steps(script, [], max_steps=3, seed=7)
    second = harness.record_steps(script, [], max_steps=3, seed=7)
    assert first.losses == second.losses


PERSISTENT = textwrap.dedent("""\
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if __name__ == "__main__":
        loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, num_workers=1,
                            persistent_workers=sys.argv[1] == "persistent")
        for epoch in range(3):
            for (batch,) in loader:
                pass
        print(torch.rand(1).item())
    """)


def test_aligned_loader_rng_keeps_persistent_workers_in_step(tmp_path, capsys):
    script = write(tmp_path, PERSISTENT)
    outputs = {}
    for align in (False, True):
        for mode in ("persistent", "fresh"):
            harness.record_steps(script, [mode], seed=0, align_loader_rng=align)
            outputs[align, mode] = capsys.readouterr().out
    assert outputs[False, "persistent"] != outputs[False, "fresh"]
    assert outputs[True, "persistent"] == outputs[True, "fresh"]


def test_progress_file_counts_the_steps_up_to_the_last(tmp_path):
    progress = tmp_path / "progress"
    record = harness.record_steps(write(tmp_path, TRAIN), [], max_steps=5, progress=progress)
    assert record.exit == "max-steps"
    assert progress.read_text() == "5"
    assert record.threads == torch.get_num_threads()


def test_a_distributed_rank_records_the_samples_of_each_step_by_pass(tmp_path, monkeypatch):
    """Passes are numbered in the order the script starts them (evaluation too), also
    when persistent workers are reused; indices drawn ahead go to their own batch."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    script = write(
        tmp_path,
        """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        data = TensorDataset(torch.randn(8, 3), torch.randn(8, 1))
        model = torch.nn.Linear(3, 1)
        train = DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
        for epoch in range(2):
            for x, y in train:
                torch.nn.functional.mse_loss(model(x), y).backward()
            for x, y in DataLoader(data, batch_size=8):
                pass
        """,
    )
    record = harness.record_steps(script, [])
    assert record.sample_ids == [
        [1, [0, 1, 2, 3]],
        [1, [4, 5, 6, 7]],
        [3, [0, 1, 2, 3]],
        [3, [4, 5, 6, 7]],
    ]
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process too: the proof compares its orders
    one = harness.record_steps(write(tmp_path, TRAIN, "one.py"), []).sample_ids
    assert len(one) == 12 and one[0] == [1, [0, 1, 2, 3]] and one[6] == [2, [0, 1, 2, 3]]


def test_an_epoch_cut_short_ends_training_passes_and_leaves_evaluation_whole(tmp_path):
    """`--epoch-steps`: each pass of the (persistent) training loader ends after 2 batches,
    so the script reaches its epoch ends; the evaluation loader, which feeds no backward,
    runs whole."""
    script = write(
        tmp_path,
        """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        data = TensorDataset(torch.randn(24, 3), torch.randn(24, 1))
        model = torch.nn.Linear(3, 1)
        train = DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
        for epoch in range(3):
            for x, y in train:
                torch.nn.functional.mse_loss(model(x), y).backward()
            print("evaluated", sum(len(x) for x, _ in DataLoader(data, batch_size=6)))
        """,
    )
    record = harness.record_steps(script, [], epoch_cut=harness.EpochCut(steps=2))
    assert record.exit == "ok" and len(record.losses) == 6
    assert record.epochs_cut == 3 and record.epoch_samples == 8
    assert record.printed == ["evaluated 24"] * 3


def test_a_process_epoch_ends_at_its_share_of_the_samples(tmp_path, monkeypatch):
    """`--epoch-samples 8` on one of 2 processes: its passes end after 4 samples, two
    batches of 2, as 8 samples of the one process were the original's epoch."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    script = TRAIN.replace("batch_size=4", "batch_size=2")
    record = harness.record_steps(
        write(tmp_path, script), [], epoch_cut=harness.EpochCut(samples=8)
    )
    assert len(record.losses) == 4 and record.samples[-1] == 8
    assert record.epochs_cut == 2 and record.epoch_samples == 4


def test_a_write_is_placed_at_the_line_of_the_scripts_code_that_made_it(tmp_path, monkeypatch):
    """A helper module of the project writes (through `json.dump` into a file it opened,
    and `torch.save`): the record names the helper's lines, not the library's."""
    write(
        tmp_path,
        """\
        import json
        import torch

        def save_all(model):
            with open("metrics.json", "w") as f:
                json.dump({"loss": 1.0}, f)
            torch.save(model.state_dict(), "model.pt")
        """,
        "helpers.py",
    )
    script = write(
        tmp_path, "import torch\nfrom helpers import save_all\nsave_all(torch.nn.Linear(1, 1))\n"
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scratch").mkdir()
    record = harness.record_steps(script, [], scratch=tmp_path / "scratch")
    assert record.write_sites == {"metrics.json": "helpers.py:5", "model.pt": "helpers.py:7"}


def test_folders_a_trial_run_makes_are_recorded_and_removed_afterwards(tmp_path, monkeypatch):
    """The sixth unseen set: `convert`'s short run left empty `logs/`, `chkpt/`, `runs/`
    folders in 9 of 16 projects (`os.makedirs` was not redirected as writes are). The
    folders are made (the script may list or test them) and removed when the run ends."""
    script = write(
        tmp_path,
        """\
        import os
        from pathlib import Path

        os.makedirs("logs/run1", exist_ok=True)
        os.makedirs("logs/run1", exist_ok=True)
        Path("ckpt").mkdir()
        with open("logs/run1/loss.txt", "w") as f:
            f.write("1.0")
        assert os.path.isdir("logs/run1") and os.listdir("logs/run1") == []
        """,
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scratch").mkdir()
    record = harness.record_steps(script, [], scratch=tmp_path / "scratch")
    assert record.exit == "ok", record.exit
    made = [str(tmp_path / name) for name in ("logs", "logs/run1", "ckpt")]
    assert record.made_folders == made
    remove_made_folders([asdict(record)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch", "train.py"]


def test_a_copy_into_a_folder_the_script_made_goes_to_scratch_mode_and_times_too(
    tmp_path, monkeypatch
):
    """bench33 F7 (semseg): `shutil.copy(config, run_dir)` wrote the copy into scratch but
    set its mode (`os.chmod`) on the real path, never written: FileNotFoundError, and the
    proof called the original script broken. `copy2` sets the times (`os.utime`) too."""
    script = write(
        tmp_path,
        """\
        import os
        import shutil

        os.makedirs("runs/1")
        shutil.copy("config.yml", "runs/1")
        shutil.copy2("config.yml", "runs/1/again.yml")
        with open("runs/1/config.yml") as f:
            assert f.read() == "lr: 1"
        """,
    )
    (tmp_path / "config.yml").write_text("lr: 1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scratch").mkdir()
    record = harness.record_steps(script, [], scratch=tmp_path / "scratch")
    assert record.exit == "ok", record.exit
    assert os.listdir(tmp_path / "runs/1") == []
    assert len(os.listdir(tmp_path / "scratch")) == 2


def test_logged_numbers_and_messages_are_recorded_with_their_steps(tmp_path, monkeypatch):
    """The scalars a script logs to TensorBoard (a project's `SummaryWriter` subclass,
    `add_scalars`) or wandb (`wandb.log`, the `log` of the run `wandb.init` made), patched
    once the script imports their module, with the steps done and where the script logged
    each tag; images and the like are left out. A logging message two handlers handle is
    kept once, with the printed lines; one no handler takes is not."""
    write(tmp_path, """\
        class SummaryWriter:
            def add_scalar(self, tag, scalar_value, global_step=None):
                pass

            def add_scalars(self, main_tag, tag_scalar_dict, global_step=None):
                pass
        """, "tensorboardX.py")  # fmt: skip
    write(tmp_path, """\
        class Run:
            def log(self, data, step=None):
                pass

        def init():
            global log
            log = Run().log
        """, "wandb.py")  # fmt: skip
    for module in ("tensorboardX", "wandb"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    script = """\
        import io
        import logging

        import torch
        import wandb
        from tensorboardX import SummaryWriter


        class Writer(SummaryWriter):
            def log_validation(self, loss, step):
                self.add_scalar("validation.g_loss", loss, step)


        log = logging.getLogger("test_harness.logged")
        log.propagate = False
        log.setLevel(logging.INFO)
        log.handlers = [logging.StreamHandler(), logging.StreamHandler(io.StringIO())]
        writer = Writer()
        wandb.init()
        model = torch.nn.Linear(2, 1)
        for step in range(2):
            model(torch.ones(1, 2)).sum().backward()
            writer.log_validation(torch.tensor(0.5 * step), step)
            writer.add_scalars("val", {"loss": 1.0, "image": "x"}, step)
            wandb.log({"train/loss_avg": step, "hist": [1, 2]})
            log.info("val loss %.2f", 0.25 * step)
            log.debug("not shown %d", step)
        """
    record = harness.record_steps(write(tmp_path, script), [])
    assert record.exit == "ok"
    assert record.logged == [
        [tag, value, step + 1]
        for step in range(2)
        for tag, value in (
            ("validation.g_loss", 0.5 * step), ("val/loss", 1.0), ("train/loss_avg", step)
        )
    ]  # fmt: skip
    assert record.log_sites["validation.g_loss"] == "train.py:11"
    assert record.printed == ["val loss 0.00", "val loss 0.25"] and record.printed_steps == [1, 2]
    writer = sys.modules["tensorboardX"].SummaryWriter
    assert writer.add_scalar.__qualname__ == "SummaryWriter.add_scalar", "patched for the run only"


def test_main_writes_the_record_and_reports_errors(tmp_path):
    out = tmp_path / "record-{rank}.json"
    assert harness.main(["--losses-out", str(out), "--max-steps", "2", write(tmp_path, TRAIN)]) == 0
    record = json.loads((tmp_path / "record-0.json").read_text())
    assert record["exit"] == "max-steps" and len(record["losses"]) == 2
    broken = write(tmp_path, "raise ValueError('boom')\n", "broken.py")
    assert harness.main(["--losses-out", str(out), broken]) == 1
    assert json.loads((tmp_path / "record-0.json").read_text())["exit"] == "error: ValueError: boom"


@pytest.mark.parametrize(
    "script_args",
    [["--epoch", "3"], ["--ep", "1"], ["--seed", "5", "--max-steps", "9", "--epoch-steps", "2"]],
    ids=["prefix-of-two-options", "prefix-of-one-option", "same-names"],
)
def test_the_script_s_arguments_reach_it_untouched(script_args):
    """torchfm's `--epoch 3` was taken for an ambiguous abbreviation of `--epoch-steps` /
    `--epoch-samples`: the harness exited 2, and convert said the original fails."""
    ns = harness.arguments(["--losses-out", "r.json", "--max-steps", "4", "train.py", *script_args])
    assert (ns.max_steps, ns.seed, ns.epoch_steps) == (4, None, None)
    assert (ns.script, ns.args) == ("train.py", script_args)


def test_capture_hands_over_the_loaders_before_training(tmp_path):
    script = write(
        tmp_path,
        """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        data = TensorDataset(torch.randn(24, 3))
        train = DataLoader(data, batch_size=8,
                           shuffle=True)
        for (x,) in train:
            raise SystemExit("the script must not train")
        """,
    )
    seen = []
    assert capture_loaders(script, [], seen.extend) == "ok"
    [captured] = seen
    assert (captured.line, captured.column) == (5, 8)
    assert captured.arguments == {
        "dataset": captured.loader.dataset,
        "batch_size": 8,
        "shuffle": True,
    }
    assert captured.arguments_with({"num_workers": 0})["num_workers"] == 0


def test_capture_without_loaders_hands_over_nothing(tmp_path):
    script = write(
        tmp_path, "import torch\nx = torch.ones(1, requires_grad=True)\n(2 * x).sum().backward()\n"
    )
    seen = [None]
    assert capture_loaders(script, [], lambda loaders: seen.append(loaders)) == "ok"
    assert seen[-1] == []


def test_the_first_steps_data_is_fingerprinted_only_when_asked(tmp_path):
    """The proof's runs ask (`--batch-prints`); a benchmark's steps pay nothing for it."""
    path = write(tmp_path, TRAIN)
    assert harness.record_steps(path, [], max_steps=3).batch_prints == []
    prints = harness.record_steps(path, [], max_steps=3, batch_prints=True).batch_prints
    assert len(prints) == 3 and all(step for step in prints)


def test_a_tensor_whose_memory_was_let_go_is_told_apart():
    """FSDP resizes the storage of whole parameters to nothing after a call: reading such
    a tensor crashes the process, so the digest leaves it out (see test_convert_verify)."""
    import torch

    kept, freed = torch.ones(4, 3), torch.ones(4, 3)
    freed.untyped_storage().resize_(0)
    assert harness._has_memory(kept) and harness._has_memory(kept.t()[1:])
    assert not harness._has_memory(freed)


def test_a_probe_fitted_after_training_began_is_left_out_of_the_digest(tmp_path):
    """SimCLR's linear evaluation: features encoded under `no_grad()` (batches of an
    evaluation, not counted), then an L-BFGS head built and fitted on them. Each process
    of a distributed run fits its own head, from its own random start: the digest, which
    must be equal on every process, leaves that optimizer out and counts it."""
    probe = TRAIN + textwrap.dedent("""\
        with torch.no_grad():
            features = torch.cat([model(x) for x, _ in DataLoader(data, batch_size=12)])
        head = torch.nn.Linear(1, 1)
        fit = torch.optim.LBFGS(head.parameters(), max_iter=2)
        def closure():
            fit.zero_grad()
            loss = head(features).pow(2).mean()
            loss.backward()
            return loss
        fit.step(closure)
        """)
    record = harness.record_steps(write(tmp_path, probe), [])
    assert record.fits == 1 and len(record.param_digest) == 1
    fitted = len(record.losses) - 12
    assert fitted >= 1 and record.samples[12:] == [48] * fitted  # no evaluation batch counted
    assert record.sample_ids[12:] == [None] * fitted
