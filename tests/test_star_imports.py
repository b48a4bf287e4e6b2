"""`from module import *` of a module of the project binds the names the module exports
(its `__all__`, or its top-level names without a leading underscore), each meaning what
it means there: char-rnn's `from helpers import *` gives the script Python's `random`,
and `from model import *` the model's class. A library's star import binds the names
nothing else binds (tests/test_convert_tqdm_loader.py).

Also the conversion this unlocks: fixtures/projects/star_import_lm (char-rnn's shape:
random chunks drawn in `random_training_set()` with a star-imported `random`) converts
`--to ddp` and `--to fsdp`, each process drawing its own chunks (it was refused: batches
"it cannot follow")."""

from __future__ import annotations

import textwrap

import libcst as cst
from running import FIXTURES_DIR

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.program import Kind, Program, SourceModule
from autoaccel.analysis.shapes import find
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.fileio import read_source

LM = FIXTURES_DIR / "projects" / "star_import_lm"

HELPERS = """\
import random
import numpy as np
import torch.nn as nn

TEXT = "abc"
_CACHE = {}


def encode(chunk):
    return [ord(c) for c in chunk]
"""

MODEL = """\
import torch.nn as nn


class CharGRU(nn.Module):
    pass
"""


def program(
    files: dict[str, str], packages: dict[str, str] | None = None
) -> dict[str, SourceModule]:
    """The modules of `files` (import name -> source; the script is `__main__`), analysed
    together."""
    modules = {}
    for name, source in files.items():
        tree = cst.parse_module(textwrap.dedent(source))
        modules[name] = SourceModule(
            name, tree, ModuleIndex(tree), package=(packages or {}).get(name, "")
        )
    Program.of(list(modules.values()))
    return modules


def names(module: SourceModule, spelled: str) -> frozenset[str]:
    """The qualified names of the last read written `spelled` in `module`."""
    tree = module.tree
    *_, node = [
        n for n in find(tree, (cst.Name, cst.Attribute)) if tree.code_for_node(n) == spelled
    ]
    return module.index.qualified_names(node)


def test_star_imported_names_mean_what_they_mean_in_their_module():
    script = """\
        from helpers import *
        from model import *

        start = random.randint(0, len(TEXT))
        offsets = np.random.randint(0, 3, 4)
        criterion = nn.CrossEntropyLoss()
        model = CharGRU()
        data = encode(TEXT)
    """
    main = program({"__main__": script, "helpers": HELPERS, "model": MODEL})["__main__"]
    assert names(main, "random.randint") == {"random.randint"}
    assert names(main, "np.random.randint") == {"numpy.random.randint"}
    assert names(main, "nn.CrossEntropyLoss") == {"torch.nn.CrossEntropyLoss"}
    assert names(main, "CharGRU") == {"model.CharGRU"}
    assert names(main, "encode") == {"helpers.encode"}
    assert names(main, "TEXT") == {"helpers.TEXT"}


def test_the_model_class_of_a_star_import_is_the_project_s_class():
    """It was an object the analysis knows nothing of (`Net()` of unknown code)."""
    script = "from model import *\n\nmodel = CharGRU()\n"
    modules = {
        name: SourceModule(name, tree, ModuleIndex(tree))
        for name, tree in (
            ("__main__", cst.parse_module(script)),
            ("model", cst.parse_module(MODEL)),
        )
    }
    solved = Program.of(list(modules.values()))
    (call,) = find(modules["__main__"].tree, cst.Call)
    (made,) = solved.values_of(call, modules["__main__"])
    assert made.kind is Kind.MODULE and made.cls is not None and made.cls.name == "CharGRU"


def test_underscored_names_and_names_outside_all_are_not_imported():
    declared = HELPERS + '\n__all__ = ["encode", "TEXT"]\n'
    main = program(
        {
            "__main__": "from helpers import *\n\nrandom.seed(0)\n_CACHE.clear()\n",
            "helpers": HELPERS,
        }
    )["__main__"]
    assert names(main, "random.seed") == {"random.seed"}
    assert names(main, "_CACHE.clear") == frozenset()
    script = "from helpers import *\n\nrandom.seed(encode(TEXT))\n"
    main = program({"__main__": script, "helpers": declared})["__main__"]
    assert names(main, "random.seed") == frozenset()
    assert names(main, "encode") == {"helpers.encode"}


def test_a_name_the_script_binds_itself_keeps_its_meaning():
    script = """\
        import random as nn
        from helpers import *

        TEXT = "xyz"
        layer = nn.Linear
        print(TEXT)
    """
    main = program({"__main__": script, "helpers": HELPERS})["__main__"]
    assert names(main, "nn.Linear") == {"random.Linear"}
    assert names(main, "TEXT") == frozenset()


def test_star_imports_chain_and_may_be_relative():
    """`from .common import *` in a package whose `common` star-imports `helpers`."""
    files = {
        "__main__": "from lm.train import *\n",
        "lm.train": "from .common import *\n\nstart = random.randint(0, 3)\ndata = encode(TEXT)\n",
        "lm.common": "from helpers import *\n",
        "helpers": HELPERS,
    }
    train = program(files, {"lm.train": "lm", "lm.common": "lm"})["lm.train"]
    assert names(train, "random.randint") == {"random.randint"}
    assert names(train, "encode") == {"helpers.encode"}


def test_a_cycle_of_star_imports_ends():
    files = {
        "__main__": "from a import *\n\nx = f()\n",
        "a": "from b import *\n\ndef f():\n    pass\n",
        "b": "from a import *\n",
    }
    assert names(program(files)["__main__"], "f") == {"a.f"}


def test_a_library_s_star_import_binds_what_nothing_else_binds():
    main = program({"__main__": "from torch import *\n\nx = randn(3)\n"})["__main__"]
    assert names(main, "randn") == {"torch.randn"}


# -- the conversion of fixtures/projects/star_import_lm ---------------------------------------
def converted(target: str) -> dict[str, object]:
    """The fixture's project converted `--to TARGET --amp off` in this process (no proof
    run), refusing nothing: its files' conversions by file name."""
    script = LM / "train.py"
    project = find_project(script, read_source(script))
    assert project is not None
    result = convert_project(project, ConvertOptions(target=target, amp="off"), "train.py")
    for file in result.files:
        assert not [s for s in file.conversion.log.skipped if s.wrong], file.file.path
    return {file.file.path.name: file.conversion for file in result.files}


def test_random_chunks_drawn_with_a_star_imported_random_convert_to_ddp():
    """Each process draws its own chunks: `random` is Python's, unseeded. It was refused:
    batches from `random_training_set()` "it cannot follow"."""
    (train,) = converted("ddp").values()  # helpers.py and model.py stay as they are
    (note,) = [s for s in train.log.skipped if s.what == "DistributedSampler"]
    assert (
        "from Python's or NumPy's generator, unseeded, so each process draws its own" in note.reason
    )
    code = train.converted
    assert "ddp_model = DDP(" in code and "output, state = ddp_model(inputs[:, c], state)" in code
    assert "    state = model.init_state(BATCH_SIZE)\n" in code
    assert 'if RANK == 0:\n    torch.save(model.state_dict(), "star_import_lm.pt")' in code


def test_random_chunks_drawn_with_a_star_imported_random_convert_to_fsdp():
    (train,) = converted("fsdp").values()
    assert "fully_shard(model" in train.converted
