"""Show a bench result: a table on the terminal, and `--report DIR` files: bench.json,
bench.png (loss curves overlaid, throughput bars; needs matplotlib) and index.html."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from autoaccel.bench.compare import (
    FASTER,
    MIN_EFFECT,
    MIN_JUDGED_REPEATS,
    NOT_JUDGED,
    SAME,
    SLOWER,
    moving_average,
)
from autoaccel.convert.verify import Check

PLOT_HINT = "bench.png needs matplotlib: pip install 'autoaccel[plot]'"
_RUNS = ("original", "converted")


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _rate(value: float | None) -> str:
    """A throughput to three significant digits, more above 1,000: `0.123`, `12.3`,
    `1,234` (so a rounding step is at most 1 % of the value)."""
    if value is None:
        return "-"
    rounded = float(f"{value:.3g}")  # 9.996 -> 10.0: the digits of the rounded value
    digits = 2 - math.floor(math.log10(abs(rounded))) if rounded else 2
    return _number(value, max(0, digits))


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f} MiB"


def _peak(run: dict[str, Any]) -> str:
    cuda = run["peak_cuda_bytes"]
    return f"{_mib(cuda)} CUDA" if cuda is not None else f"{_mib(run['peak_rss_bytes'])} RSS"


def _metric(result: dict[str, Any]) -> str:
    """The throughput the speed-up is the ratio of: samples/s, else steps/s."""
    runs = result["runs"]
    return "samples_per_s" if all(runs[n]["samples_per_s"] for n in _RUNS) else "steps_per_s"


def rows(result: dict[str, Any]) -> list[list[str]]:
    """The comparison table: a header row, then one row per side: medians over the runs,
    and the range of the runs for the throughput the speed-up compares."""
    metric = _metric(result)
    header = ["", "steps/s", "samples/s", f"{metric.replace('_per_s', '/s')} range"]
    table = [header + ["peak memory", "last loss"]]
    for name in _RUNS:
        run = result["runs"][name]
        spread = run[f"{metric}_range"]
        shown = "-" if spread is None else " - ".join(_rate(value) for value in spread)
        last = run["losses"][-1] if run["losses"] else None
        table.append(
            [
                name,
                _rate(run["steps_per_s"]),
                _rate(run["samples_per_s"]),
                shown,
                _peak(run),
                _number(last, 4),
            ]
        )
    return table


def memory_verdict(result: dict[str, Any]) -> str:
    """`bench --to fsdp`: the largest rank's peak memory, FSDP's and DDP's."""
    baseline = result["ddp_peak"]
    if baseline is None:
        return "peak memory per rank vs --to ddp: not measured (the ddp conversion did not run)"
    fsdp = _peak(result["runs"]["converted"])
    what = (
        ""
        if baseline["peak_cuda_bytes"] is not None
        else (" (RSS: the whole process on the CPU, the torch runtime included)")
    )
    return f"peak memory per rank: fsdp {fsdp}, ddp {_peak(baseline)}{what}"


def speed_verdict(result: dict[str, Any]) -> str:
    """`speed-up 1.04x (pairs of runs 1.00x-1.09x): no measurable difference ...`."""
    speedup, spread = result["speedup"], result["speedup_range"]
    runs = f"{result['repeats']} run{'s' * (result['repeats'] != 1)} each"
    if speedup is None:
        return f"speed-up not measured ({runs})"
    text = f"speed-up {_number(speedup, 2)}x"
    if spread is not None and result["repeats"] > 1:
        text += f" (pairs of runs {_number(spread[0], 2)}x-{_number(spread[1], 2)}x)"
    if result["speed"] == NOT_JUDGED:
        return f"{text}: not judged, {runs}; --repeats {MIN_JUDGED_REPEATS} or more to judge"
    margin = _margin(result["speed_margin"])
    if result["speed"] == SAME:
        return (
            f"{text}: no measurable difference over {runs} "
            f"(not every pair differs by more than {margin})"
        )
    if result["speed"] == SLOWER:
        return f"{text}: SLOWER in every pair of runs by more than {margin} ({runs})"
    return f"{text}: faster in every pair of runs by more than {margin} ({runs})"


def _margin(margin: float) -> str:
    """The difference a pair must exceed, and where it comes from when it is not the minimum."""
    shown = f"{_number(margin * 100, 1)}%"
    return shown if margin <= MIN_EFFECT else f"{shown}, the spread of the original's runs"


def throughput_title(result: dict[str, Any]) -> str:
    """The title of the throughput bars: the verdict, with the speed-up only when it is
    one."""
    speedup = _number(result["speedup"], 2)
    if result["speed"] == FASTER:
        return f"Throughput: {speedup}x faster"
    if result["speed"] == SLOWER:
        return f"Throughput: {speedup}x, SLOWER"
    if result["speed"] == SAME:
        return "Throughput: no measurable difference"
    return f"Throughput: {speedup}x, not judged"


def loss_verdict(result: dict[str, Any]) -> str:
    difference = result["max_rel_diff"]
    shown = "not comparable" if difference is None else f"{difference:.3%}"
    agreement = "agree" if result["agree"] else "DIVERGE"
    window = result["smoothing_window"]
    averaged = f" of the {window}-step moving averages" if window > 1 else ""
    return (
        f"loss curves {agreement}: max relative difference{averaged} {shown} over "
        f"{result['compared_steps']} steps (tolerance {result['tolerance']:.3%})"
    )


def print_result(result: dict[str, Any], console: Console, allow_slower: bool = False) -> None:
    console.print(f"{result['script']}: {result['command']}", markup=False, highlight=False)
    header, *body = rows(result)
    table = Table(box=box.SIMPLE_HEAD)
    for index, title in enumerate(header):
        table.add_column(title, justify="left" if index == 0 else "right", no_wrap=True)
    for row in body:
        table.add_row(*row)
    console.print(table)
    speed_style = {FASTER: "green", SLOWER: "yellow" if allow_slower else "bold red"}
    console.print(
        speed_verdict(result), style=speed_style.get(result["speed"]), markup=False, highlight=False
    )
    console.print(
        loss_verdict(result),
        style="green" if result["agree"] else "bold red",
        markup=False,
        highlight=False,
    )
    if "ddp_peak" in result:
        console.print(memory_verdict(result), markup=False, highlight=False)
    for check in (Check(**fields) for fields in result.get("verify", [])):
        console.print(
            check.line, style=None if check.passed else "bold red", markup=False, highlight=False
        )
    if result.get("threads"):
        console.print(f"both sides ran with OMP_NUM_THREADS={result['threads']}", markup=False)


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
    """Draw `figure(result)` into `path`; return the PNG bytes."""
    import matplotlib.pyplot as plt

    drawn = figure(result)
    drawn.savefig(path, dpi=100)
    plt.close(drawn)
    return path.read_bytes()


def figure(result: dict[str, Any]) -> Any:
    """The loss curves (warm-up steps shaded, integer step ticks) and the throughput bars
    (median, whiskers over the runs' range, a dot per run), as a matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    runs = result["runs"]
    picture, (curves, bars) = plt.subplots(
        1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]}
    )
    if result["warmup"]:
        curves.axvspan(0.5, result["warmup"] + 0.5, color="0.9", label="warm-up (not timed)")
    window = result["smoothing_window"]
    for name, style in zip(_RUNS, ("-", "--")):
        losses = runs[name]["losses"]
        thin = {"alpha": 0.35} if window > 1 else {}
        curves.plot(range(1, len(losses) + 1), losses, style, label=name, **thin)
        if window > 1:  # what the agreement is judged on (ddp)
            averaged = moving_average(losses, window)
            curves.plot(
                range(window, len(losses) + 1),
                averaged,
                style,
                linewidth=2,
                label=f"{name}, {window}-step mean",
            )
    curves.xaxis.set_major_locator(MaxNLocator(integer=True))
    curves.set(xlabel="training step", ylabel="loss", title="Loss per step (first run)")
    curves.legend()
    metric = _metric(result)
    values = [runs[name][metric] or 0.0 for name in _RUNS]
    colour = {FASTER: "tab:green", SLOWER: "tab:red"}.get(result["speed"], "tab:gray")
    drawn = bars.bar(_RUNS, values, color=["tab:gray", colour])
    for position, name in enumerate(_RUNS):
        per_run = [run[metric] for run in runs[name]["per_run"] if run[metric] is not None]
        if len(per_run) > 1:
            low, high = min(per_run), max(per_run)
            median = runs[name][metric]
            whiskers = [[median - low], [high - median]]
            bars.errorbar(position, median, yerr=whiskers, color="black", capsize=6)
            bars.plot([position] * len(per_run), per_run, "k.", alpha=0.6)
    bars.bar_label(drawn, labels=[_rate(value) for value in values], label_type="center")
    bars.margins(y=0.15)
    bars.set(ylabel=metric.replace("_per_s", "/s") + " (median)", title=throughput_title(result))
    picture.suptitle(f"{result['script']}: {result['command']}")
    picture.tight_layout()
    return picture


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
    device = html.escape(
        f"{result['device_name']} ({result['device']}), torch {result['torch_version']}"
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>autoaccel bench: {html.escape(result['script'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:right}}
td:first-child{{text-align:left}}table{{border-collapse:collapse}}tr:nth-child(even){{background:#f4f4f4}}</style>
</head><body>
<h1>autoaccel bench</h1>
<p><code>{html.escape(result['command'])}</code> on {device}</p>
<table>{''.join(lines)}</table>
<p>{html.escape(speed_verdict(result))}</p>
<p>{html.escape(loss_verdict(result))}</p>
{image}
</body></html>
"""
