"""Show a bench result: a table on the terminal, and `--report DIR` files: bench.json,
bench.png (loss curves overlaid, throughput bars; needs matplotlib) and index.html."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

PLOT_HINT = "bench.png needs matplotlib: pip install 'autoaccel[plot]'"
_RUNS = ("original", "converted")


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f} MiB"


def _peak(run: dict[str, Any]) -> str:
    cuda = run["peak_cuda_bytes"]
    return f"{_mib(cuda)} CUDA" if cuda is not None else f"{_mib(run['peak_rss_bytes'])} RSS"


def rows(result: dict[str, Any]) -> list[list[str]]:
    """The comparison table: a header row, then one row per run."""
    table = [["", "steps", "steps/s", "samples/s", "peak memory", "last loss"]]
    for name in _RUNS:
        run = result["runs"][name]
        last = run["losses"][-1] if run["losses"] else None
        table.append([
            name, str(run["steps"]), _number(run["steps_per_s"], 2),
            _number(run["samples_per_s"]), _peak(run), _number(last, 4),
        ])
    return table


def verdict(result: dict[str, Any]) -> str:
    speedup = result["speedup"]
    difference = result["max_rel_diff"]
    shown = "not comparable" if difference is None else f"{difference:.3%}"
    agreement = "agree" if result["agree"] else "DIVERGE"
    return (
        f"speed-up {_number(speedup, 2)}x; loss curves {agreement}: max relative difference "
        f"{shown} over {result['compared_steps']} steps (tolerance {result['tolerance']:.3%})"
    )


def print_result(result: dict[str, Any], console: Console) -> None:
    console.print(f"{result['script']}: {result['command']}", markup=False, highlight=False)
    header, *body = rows(result)
    table = Table(box=box.SIMPLE_HEAD)
    for index, title in enumerate(header):
        table.add_column(title, justify="left" if index == 0 else "right", no_wrap=True)
    for row in body:
        table.add_row(*row)
    console.print(table)
    style = "green" if result["agree"] else "bold red"
    console.print(verdict(result), style=style, markup=False, highlight=False)


def write_report(result: dict[str, Any], folder: Path) -> list[str]:
    """Write bench.json, bench.png and index.html into `folder`; return warnings."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    warnings = []
    try:
        picture = plot(result, folder / "bench.png")
    except ImportError:
        picture = None
        warnings.append(PLOT_HINT)
    (folder / "index.html").write_text(page(result, picture), encoding="utf-8")
    return warnings


def plot(result: dict[str, Any], path: Path) -> bytes:
    """Draw the loss curves and the throughput bars into `path`; return the PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    figure, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for name, style in zip(_RUNS, ("-", "--")):
        losses = runs[name]["losses"]
        curves.plot(range(1, len(losses) + 1), losses, style, label=name)
    curves.set(xlabel="training step", ylabel="loss", title="Loss per step")
    curves.legend()
    metric = "samples_per_s" if all(runs[n]["samples_per_s"] for n in _RUNS) else "steps_per_s"
    values = [runs[name][metric] or 0.0 for name in _RUNS]
    drawn = bars.bar(_RUNS, values, color=["tab:gray", "tab:green"])
    bars.bar_label(drawn, fmt="%.1f")
    bars.margins(y=0.15)
    bars.set(ylabel=metric.replace("_per_s", "/s"), title=f"Throughput ({_number(result['speedup'], 2)}x)")
    figure.suptitle(f"{result['script']}: {result['command']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path.read_bytes()


def page(result: dict[str, Any], picture: bytes | None) -> str:
    """A self-contained HTML page: the table, the verdict and the picture inline."""
    header, *body = rows(result)
    cells = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    lines = [f"<tr>{cells}</tr>"]
    lines += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body]
    image = (
        f'<img alt="loss curves and throughput" src="data:image/png;base64,'
        f'{base64.b64encode(picture).decode()}">'
        if picture
        else f"<p>{html.escape(PLOT_HINT)}</p>"
    )
    device = html.escape(f"{result['device_name']} ({result['device']}), torch {result['torch_version']}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>autoaccel bench: {html.escape(result['script'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:right}}
td:first-child{{text-align:left}}table{{border-collapse:collapse}}tr:nth-child(even){{background:#f4f4f4}}</style>
</head><body>
<h1>autoaccel bench</h1>
<p><code>{html.escape(result['command'])}</code> on {device}</p>
<table>{''.join(lines)}</table>
<p>{html.escape(verdict(result))}</p>
{image}
</body></html>
"""
