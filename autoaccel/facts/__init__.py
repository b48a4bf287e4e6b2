"""Facts from a short run of the script: what it makes and calls, keyed to the source
positions that did it (the MonkeyType approach: record at run time, rewrite statically).

* `model`: `RunFacts` and its parts (JSON in, dataclasses out);
* `recorder`: the child side, run inside `autoaccel.run.harness` (torch imported there only);
* `resolve`: `FactsResolver`, from recorded positions to the LibCST nodes of a module.

The parent side, `collect_facts`, is `autoaccel.run.facts`: it runs the script.
Importing this package imports neither torch nor LibCST.
"""

from autoaccel.facts.model import Called, Forward, Made, Printed, RunFacts, Site, Write

__all__ = ["Called", "Forward", "Made", "Printed", "RunFacts", "Site", "Write"]
