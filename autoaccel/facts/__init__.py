"""Facts from a short run of the script: what it makes and calls, keyed to the source
positions that did it (the MonkeyType approach: record at run time, rewrite statically).

* `model`: `RunFacts` and its parts (JSON in, dataclasses out);
* `recorder`: the child side, run inside `autoaccel.harness` (torch imported there only);
* `run`: `collect_facts`, the parent side (a child process with a timeout and a step limit);
* `resolve`: `FactsResolver`, from recorded positions to the LibCST nodes of a module.

Importing this package imports neither torch nor LibCST.
"""

from autoaccel.facts.model import Called, Forward, Made, Printed, RunFacts, Site, Write
from autoaccel.facts.run import FactsRequest, FactsRun, collect_facts

__all__ = [
    "Called",
    "FactsRequest",
    "FactsRun",
    "Forward",
    "Made",
    "Printed",
    "RunFacts",
    "Site",
    "Write",
    "collect_facts",
]
