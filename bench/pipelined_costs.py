"""A forward's cost by tokens per row, timed two ways on this machine: one synchronized
forward at a time, as the verify-cost surface is measured (`costs.measure_surface`), and
several queued back to back, as the resident loop and plain decoding run them
(`costs.pipelined_verify`). Relative costs are against one token per row.

    PYTHONPATH=. python bench/pipelined_costs.py [ROWS ...]   (default: 64)
"""

import sys

from core.engine import load_model
from core.engine.costs import PIPELINED_WIDTHS, measure_surface, pipelined_verify


def main() -> None:
    model = load_model("smollm2-135m").model
    for rows in [int(a) for a in sys.argv[1:]] or [64]:
        synced = measure_surface(model, batches=(rows,), widths=PIPELINED_WIDTHS)
        piped = pipelined_verify(model, rows)
        print(f"{rows} rows: tokens a row, synchronized ms (relative), pipelined ms (relative)")
        s1, p1 = synced(rows, rows), piped(1)
        for w in PIPELINED_WIDTHS:
            s, p = synced(rows, rows * w), piped(w)
            print(f"  {w:2d}  {s:8.2f} ({s / s1:.2f})  {p:8.2f} ({p / p1:.2f})")


if __name__ == "__main__":
    main()
