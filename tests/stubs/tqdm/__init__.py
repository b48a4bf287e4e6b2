"""A stand-in for tqdm, which is not installed here: `tqdm(iterable)` yields the items
and draws one line per item on stderr (`bar <n>/<total>`) unless `disable`."""

import sys


def tqdm(iterable=None, total=None, disable=False, **kwargs):
    items = list(iterable)
    for n, item in enumerate(items, 1):
        if not disable:
            print(f"bar {n}/{total or len(items)}", file=sys.stderr)
        yield item


def trange(*args, **kwargs):
    return tqdm(range(*args), **kwargs)
