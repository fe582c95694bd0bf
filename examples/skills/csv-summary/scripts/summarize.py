"""Summarize a CSV file: how many rows, and for each column its type (number or text), range and empty cells.

Run by the agent from the skill's folder in its sandbox: `python3 scripts/summarize.py data.csv`.
"""

from __future__ import annotations

import csv
import sys


def summarize(path: str) -> list[str]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    lines = [f"{len(rows)} rows"]
    for column in rows[0].keys() if rows else []:
        values = [row[column] for row in rows if row[column] not in ("", None)]
        empty = len(rows) - len(values)
        try:
            numbers = [float(value) for value in values]
        except ValueError:
            lines.append(f"{column}: text, {len(set(values))} distinct, {empty} empty")
            continue
        span = f"{min(numbers)} to {max(numbers)}" if numbers else "no values"
        lines.append(f"{column}: number, {span}, {empty} empty")
    return lines


if __name__ == "__main__":
    print("\n".join(summarize(sys.argv[1])))
