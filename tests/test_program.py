"""The whole-program model reads module-level names in order, as Python runs them."""

from __future__ import annotations

import textwrap

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from autoaccel.analysis.program import Kind, Program
from autoaccel.analysis.script_model import ScriptModel, build_script_model
from autoaccel.analysis.shapes import find

HEADER = "import torch.nn as nn\n"


def model_of(source: str) -> ScriptModel:
    module = cst.parse_module(HEADER + textwrap.dedent(source).lstrip("\n"))
    return build_script_model(MetadataWrapper(module, unsafe_skip_copy=True))


def callees(script: ScriptModel, spelled: str) -> list[list[int]]:
    """For each call written `spelled` (in source order): the lines of the `def`s it runs."""
    assert script.program is not None and script.module is not None
    tree = script.module.tree
    positions = MetadataWrapper(tree, unsafe_skip_copy=True).resolve(PositionProvider)
    lines = {node: positions[node].start.line for node in find(tree, cst.FunctionDef)}
    calls = [c for c in find(tree, cst.Call) if tree.code_for_node(c) == spelled]
    return [sorted(lines[f.node] for f in script.program.callees.get(c, ())) for c in calls]


def test_a_call_at_top_level_runs_the_definition_before_it():
    script = model_of("""
        def main():  # line 2
            pass
        main()
        def main():  # line 5
            pass
        main()
        """)
    assert callees(script, "main()") == [[2], [5]]


def test_a_function_reads_globals_when_it_is_called():
    # `run` is defined once, but each call finds the `train` bound at that time.
    script = model_of("""
        def run():
            train()
        def train():  # line 4
            pass
        run()
        def train():  # line 7
            pass
        run()
        def main():
            train()
        main()
        """)
    assert callees(script, "train()") == [[4, 7], [7]]


def test_conditional_bindings_all_reach_later_reads():
    script = model_of("""
        def step():  # line 2
            pass
        if flag:
            def step():  # line 5
                pass
        else:
            def step():  # line 8
                pass
        step()
        def step():  # line 11
            pass
        step()
        """)
    assert callees(script, "step()") == [[2, 5, 8], [11]]


def test_bindings_made_by_functions_reach_every_read():
    script = model_of("""
        def make():  # line 2
            global step
            def step():  # line 4
                pass
        def step():  # line 6
            pass
        step()
        make()
        """)
    assert callees(script, "step()") == [[4, 6]]


def test_a_function_no_code_calls_sees_the_module_as_it_ends():
    script = model_of("""
        def callback():
            helper()
        def helper():  # line 4
            pass
        def helper():  # line 6
            pass
        """)
    assert callees(script, "helper()") == [[6]]


def test_a_wrapper_rebinding_its_model_wraps_the_model_only():
    script = model_of("""
        model = nn.Linear(4, 2)
        model = nn.DataParallel(model)
        """)
    assert script.program is not None
    (wrapper,) = [o for o in script.program.objects(Kind.MODULE) if o.parallel]
    (wrapped,) = script.program.read((wrapper, "wraps"))
    assert wrapped.parallel is None
    assert "model" in script.data_parallel


def test_parameter_lists_joined_with_plus_train_both_models():
    """hunkim's seq2seq: `Adam(list(encoder.parameters()) + list(decoder.parameters()))`.
    A sum of numbers or tensors holds nothing the analysis tracks."""
    script = model_of("""
        import torch
        encoder = nn.Linear(4, 8)
        decoder = nn.Linear(8, 2)
        head = nn.Linear(2, 2)
        params = list(encoder.parameters()) + list(decoder.parameters())
        optimizer = torch.optim.Adam(params, lr=0.001)
        joined = encoder + head
        """)
    assert script.trained == {"encoder", "decoder"}
    (joined,) = [n for n in find(script.module.tree, cst.Name) if n.value == "joined"]
    assert script.values(joined) == frozenset()


def test_methods_only_calling_each_other_see_the_module_as_it_ends():
    script = model_of("""
        class Worker:
            def ping(self):
                self.pong()
                log()
            def pong(self):
                self.ping()
        def log():  # line 8
            pass
        """)
    assert callees(script, "log()") == [[8]]


def test_a_call_chain_costs_no_more_than_the_square_of_its_links(monkeypatch):
    """Each link's receiver is asked for from several places (its method, a constructor
    call, a method of an instance): without a memo, 4**n evaluations for n links. Each
    link's own constraint evaluates the chain below it once."""
    evaluations = 0
    evaluate = Program._evaluate

    def counted(self, node, module):
        nonlocal evaluations
        evaluations += 1
        return evaluate(self, node, module)

    monkeypatch.setattr(Program, "_evaluate", counted)
    links = 8
    model_of("key = 'a.b'\nnew = key" + ".replace('a', 'b')" * links + "\n")
    assert evaluations < 4 * links**2


def test_a_generator_yielding_its_argument_items_wraps_each_call_s_argument():
    """`log_every(loader)` holds the loader of its own call, as `tqdm(loader)` does: the
    training loop reads the training loader, the evaluation loop the other one."""
    script = model_of("""
        import torch

        def log_every(iterable, every):
            for i, item in enumerate(iterable):
                yield item

        train_loader = torch.utils.data.DataLoader(a)
        val_loader = torch.utils.data.DataLoader(b)
        for x in log_every(train_loader, 10):
            net(x).sum().backward()
        for x in log_every(val_loader, 10):
            net(x)
        """)
    read = {
        loop.role.value: [o.node.args[0].value.value for o in loop.loaders]
        for loop in script.step_loops.values()
        if loop.function is None
    }
    assert read == {"train": ["a"], "eval": ["b"]}


def test_an_instance_called_like_a_function_runs_its_call_method():
    script = model_of("""
        class Scaler:
            def __call__(self, loss):  # line 3
                loss.backward()
        scaler = Scaler()
        scaler(loss)
        """)
    assert callees(script, "scaler(loss)") == [[3]]


def test_devices_made_in_the_caller_are_the_accelerator_or_the_cpu():
    script = model_of("""
        import torch

        def train(device):
            return device

        if torch.accelerator.is_available():
            device = torch.accelerator.current_accelerator()
        else:
            device = torch.device("cpu")
        train(device)
        train(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        """)
    returned = find(script.module.tree, cst.Return)[0].value
    assert script.device_types(returned) == {"accelerator", "cpu", "cuda"}


def test_a_method_called_through_its_class_runs():
    """nova_gpt's `Sampler.from_training(run_dir)` (unseen set bench31): a classmethod
    (its `cls` bound to the class), a static method and a method given its instance."""
    script = model_of("""
        class Sampler:
            @classmethod
            def from_training(cls, run_dir):  # line 4
                return cls.load(run_dir)
            @staticmethod
            def load(run_dir):  # line 7
                return Sampler()
            def sample(self):  # line 9
                pass
        s = Sampler.from_training("run")
        Sampler.sample(s)
        """)
    assert callees(script, 'Sampler.from_training("run")') == [[4]]
    assert callees(script, "cls.load(run_dir)") == [[7]]
    assert callees(script, "Sampler.sample(s)") == [[9]]
