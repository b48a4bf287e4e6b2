"""Running a user's script in a child process, under convert, bench and tune alike.

* `harness`: the child side (`python -m autoaccel.run.harness`): runs the script as
  `__main__` and records the loss of every backward call;
* `runner`: the parent side: `run_script`, with a timeout, a step limit and a scratch folder;
* `facts`: a fact run, `collect_facts` (the recorder of `autoaccel.facts` in the child).

Importing this package imports neither torch nor LibCST.
"""
