"""The `autoaccel` command (and `python -m autoaccel`).

A plain `autoaccel lint` call, only paths and on/off flags (what the pre-commit hooks
run), is run without typer: importing it and parsing with it cost ~0.01 CPU-s of a
0.25 s one-file run. Everything else is parsed by the typer app in `autoaccel.cli`."""

import gc
import sys

# A one-file lint allocates ~10^6 objects, nearly all alive until it exits; at the
# default threshold (700) the collector re-scans them ~100 times (~0.015 CPU-s). Cycles
# are still collected, once per 100,000 allocations (mypy's choice, for the same reason).
GC_THRESHOLD = (100_000, 50, 50)


def main() -> None:
    if sys.argv[1:2] == ["lint"]:
        gc.set_threshold(*GC_THRESHOLD)
        from autoaccel.lint.command import run_plain_call

        code = run_plain_call(sys.argv[2:])
        if code is not None:
            sys.exit(code)
    from autoaccel.cli import main as parse_with_typer

    parse_with_typer()


if __name__ == "__main__":
    main()
