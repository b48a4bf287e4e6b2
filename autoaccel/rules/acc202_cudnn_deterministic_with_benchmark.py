"""ACC202: cuDNN asked to be deterministic and to autotune at the same time."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.shapes import is_true
from autoaccel.lint.rule import Invalid, LintRule

BENCHMARK = "torch.backends.cudnn.benchmark"
DETERMINISTIC = "torch.backends.cudnn.deterministic"
DETERMINISTIC_ALGORITHMS = "torch.use_deterministic_algorithms"


class CudnnDeterministicWithBenchmark(LintRule):
    code = "ACC202"
    name = "cudnn-deterministic-with-benchmark"
    message = (
        "`cudnn.benchmark = True` picks algorithms by timing, which defeats "
        "`cudnn.deterministic = True`: runs are not reproducible"
    )

    VALID = [
        "import torch\ntorch.backends.cudnn.deterministic = True\n"
        "torch.backends.cudnn.benchmark = False\n",
        "import torch\ntorch.backends.cudnn.benchmark = True\n",
        "import torch\ntorch.backends.cudnn.deterministic = False\n"
        "torch.backends.cudnn.benchmark = True\n",
        # One or the other, never both.
        "import torch\nif args.seed is not None:\n    torch.backends.cudnn.deterministic = True\n"
        "else:\n    torch.backends.cudnn.benchmark = True\n",
        "import torch\ndef reproducible():\n    torch.backends.cudnn.deterministic = True\n"
        "def fast():\n    torch.backends.cudnn.benchmark = True\n",
        # Benchmark is switched off again somewhere: the user manages it.
        "import torch\ntorch.backends.cudnn.benchmark = True\n"
        "if args.deterministic:\n    torch.backends.cudnn.deterministic = True\n"
        "    torch.backends.cudnn.benchmark = False\n",
        # A user's own `cudnn`.
        "import torch\nclass cudnn:\n    pass\n"
        "cudnn.deterministic = True\ncudnn.benchmark = True\n",
    ]
    INVALID = [
        Invalid(
            "import torch\ntorch.backends.cudnn.deterministic = True\n"
            "torch.backends.cudnn.benchmark = True\n"
        ),
        Invalid(
            "import torch.backends.cudnn as cudnn\ncudnn.benchmark = True\n"
            "cudnn.deterministic = True\n"
        ),
        Invalid(
            "import torch\nfrom torch.backends import cudnn\n"
            "def main():\n    if args.seed:\n        torch.use_deterministic_algorithms(True)\n"
            "    cudnn.benchmark = True\n"
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self._benchmarks: list[cst.Assign] = []
        self._deterministic: list[cst.CSTNode] = []
        self._benchmark_changed = False  # set to something other than `True` somewhere

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            names = self.qualified_names(target.target)
            if BENCHMARK in names:
                if is_true(node.value):
                    self._benchmarks.append(node)
                else:
                    self._benchmark_changed = True
            elif DETERMINISTIC in names and is_true(node.value):
                self._deterministic.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        if self.calls(node, DETERMINISTIC_ALGORITHMS) and node.args and is_true(node.args[0].value):
            self._deterministic.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        if self._benchmark_changed:
            return
        for benchmark in self._benchmarks:
            if any(not self._exclusive(benchmark, other) for other in self._deterministic):
                self.report(benchmark)

    def _exclusive(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """Whether `a` and `b` never both run: other arms of one `if`, or other functions."""
        chain_a = [a, *self.ancestors(a)]
        chain_b = [b, *self.ancestors(b)]
        if _function(chain_a) is not _function(chain_b) and None not in (
            _function(chain_a),
            _function(chain_b),
        ):
            return True
        in_b = {id(node) for node in chain_b}
        for index, node in enumerate(chain_a):
            if id(node) in in_b:
                if not isinstance(node, cst.If) or index == 0:
                    return False
                child_a = chain_a[index - 1]
                child_b = chain_b[next(i for i, n in enumerate(chain_b) if n is node) - 1]
                return (child_a is node.body) != (child_b is node.body)
        return False


def _function(chain: list[cst.CSTNode]) -> cst.FunctionDef | None:
    return next((node for node in chain if isinstance(node, cst.FunctionDef)), None)
