"""What fb/summary.py and gather/summary.py share: a run's rows by cell, and two trees' cells
compared round by round (each round's req/s, CPU ms per request and p99; b over a, paired)."""

import json
import statistics
from pathlib import Path


def rows(folder: Path, name: str) -> dict[tuple[str, int], dict]:
    return {(r["mix"], r["concurrency"]): r for r in json.loads((folder / f"{name}.json").read_text())["rows"]}


def compare(folder: Path, a: str, b: str) -> tuple[list[int], dict, dict]:
    """Print `b` over `a` per cell; return the rounds and both series ({round: {cell: row}})."""
    rounds = sorted({int(p.stem.split("-")[-1]) for p in folder.glob(f"{a}-*.json")})
    first = {i: rows(folder, f"{a}-{i}") for i in rounds}
    second = {i: rows(folder, f"{b}-{i}") for i in rounds}
    for cell in first[rounds[0]]:
        x, y = [first[i][cell] for i in rounds], [second[i][cell] for i in rounds]
        cpu = statistics.fmean(q["proxy_cpu_ms_per_req"] / p["proxy_cpu_ms_per_req"] for p, q in zip(x, y))
        rps = statistics.fmean(q["rps"] / p["rps"] for p, q in zip(x, y))
        print(
            f"{cell[0]:9} C={cell[1]:3} {a} req/s {[r['rps'] for r in x]} CPU {[r['proxy_cpu_ms_per_req'] for r in x]}"
            f" p99 {[r['p99_ms'] for r in x]} | {b} req/s {[r['rps'] for r in y]} CPU {[r['proxy_cpu_ms_per_req'] for r in y]}"
            f" p99 {[r['p99_ms'] for r in y]} | {b}/{a} CPU {cpu:.3f} req/s {rps:.3f} | errors {sum(r['errors'] for r in x + y)}"
        )
    return rounds, first, second
