"""A loop over a progress bar around the loader, with tqdm star-imported (proxyanchor's
`from tqdm import *`, `pbar = tqdm(enumerate(dl_tr))`, `for batch_idx, (x, y) in pbar:`):
a name only a library's star import can bind means that library's (`tqdm.tqdm`), so the
loop reads the DataLoader through tqdm and enumerate and the loader is sharded; the loop
spells its loader `loader`, not `pbar` (a name holding a wrapper of it), so `set_epoch`
goes on the loader. It was refused: batches from `pbar` "which the analysis cannot trace
to a torch DataLoader" (fixtures/ddp/tqdm_enumerate_var.py)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from running import FIXTURES_DIR

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.program import Program, SourceModule
from autoaccel.analysis.shapes import find
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = FIXTURES_DIR / "ddp" / "tqdm_enumerate_var.py"


def names_of_calls(source: str, modules: dict[str, str] | None = None) -> dict[str, frozenset]:
    """What the name of each call of the script `source` means, analysed with the project
    modules `modules` (import name -> source)."""
    parsed = {"__main__": source, **(modules or {})}
    found = {}
    for name, text in parsed.items():
        tree = cst.parse_module(textwrap.dedent(text))
        found[name] = SourceModule(name, tree, ModuleIndex(tree))
    Program.of(list(found.values()))
    main = found["__main__"]
    return {
        main.tree.code_for_node(call.func): main.index.qualified_names(call.func)
        for call in find(main.tree, cst.Call)
    }


def test_a_library_s_star_import_binds_the_names_nothing_else_binds():
    calls = names_of_calls("""\
        from tqdm import *
        from helpers import *

        def trange(n):
            return range(n)

        for i, b in enumerate(tqdm(load())):
            trange(step(b))
            _private(b)
        """,
        {"helpers": "def load():\n    return []\n"},
    )  # fmt: skip
    assert calls["tqdm"] == {"tqdm.tqdm"}
    assert calls["step"] == {"tqdm.step"}  # nothing else binds it
    assert calls["load"] == {"helpers.load"}  # the project's module binds it
    assert calls["enumerate"] == {"builtins.enumerate"}
    assert calls["trange"] == frozenset()  # the script's own function
    assert calls["_private"] == frozenset()  # no star import binds it


def test_two_libraries_star_imported_each_may_bind_a_name():
    calls = names_of_calls("from numpy import *\nfrom torch import *\n\nx = randn(3)\n")
    assert calls["randn"] == {"numpy.randn", "torch.randn"}


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_the_loader_of_a_star_imported_progress_bar_is_sharded(target):
    result = convert_source(
        FIXTURE.read_text(), ConvertOptions(target=target, amp="off"), str(FIXTURE)
    )
    assert not [s for s in result.log.skipped if s.wrong], result.log.skipped
    code = result.converted
    assert "sampler = DistributedSampler(data, shuffle=True) if DISTRIBUTED else None\n" in code
    assert (
        "for epoch in range(2):\n"
        "    if DISTRIBUTED:\n"
        "        loader.sampler.set_epoch(epoch)\n"  # was `pbar.sampler`, once `tqdm` was known
        "    pbar = tqdm(enumerate(loader), disable=RANK != 0)\n"
        "    for batch_idx, (x, y) in pbar:\n"
    ) in code
