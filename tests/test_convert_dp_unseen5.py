"""`--to dp` on shapes of the fifth unseen-code measurement (bench31) that converted but
would train wrongly on two GPUs or more (the CPU tests never run `nn.DataParallel`):
a graph passed as one tuple (gat_ppi: `nn.DataParallel` splits every tensor of a tuple
along dimension 0, `edge_index` (2, E) too), loss targets made once outside the step
and an image history of the project called between the forward lines (cyclegan)."""

from __future__ import annotations

from pathlib import Path

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
DP = ConvertOptions(target="dp", amp="off")


def refusals(name: str, replace: tuple[str, str] = ("", "")) -> dict[int, str]:
    """The line and reason of each step left alone."""
    source = (FIXTURES / name).read_text(encoding="utf-8").replace(*replace)
    conversion = convert_source(source, DP, name)
    return {s.line: s.reason for s in conversion.log.skipped if s.line and "forward" in s.what}


def test_a_graph_tuple_is_refused_until_a_run_shows_each_tensor_batch_first() -> None:
    (line, reason), *_ = refusals("graph_pair.py").items()
    assert line == 50  # `graph = (nodes, edge_index)`
    assert reason.startswith("`graph` is a tuple (or list) made in the step")
    assert "a short run of the script can show whether it is batch-first" in reason


def test_a_tensor_made_before_the_loop_is_not_read_by_the_replicas() -> None:
    found = refusals("global_targets.py")
    assert list(found) == [54, 59]  # `loss_G = mse(D(fake), ones)`, `pool = history.swap(fake)`
    assert found[54].startswith("`ones` is a tensor made outside the step")
    found = refusals("global_targets.py", ("history.swap(fake)", "fake"))
    assert list(found) == [54, 58]  # and `real_loss = mse(D(real), ones)`
    assert found[58].startswith("`ones` is a tensor made outside the step")


def test_an_object_of_the_project_is_not_called_by_every_replica() -> None:
    found = refusals("global_targets.py", (", ones)", ", torch.ones_like(real[:, 0]))"))
    assert list(found) == [59]  # `pool = history.swap(fake)`; the generator's step converts
    assert found[59].startswith("`history.swap(...)` calls an object of the project")
