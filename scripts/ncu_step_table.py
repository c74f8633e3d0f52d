#!/usr/bin/env python3
"""Where a decode step's time goes: the kernels of one profiled step, each alone on the GPU.

Reads the CSV `ncu --csv --metrics gpu__time_duration.sum` writes for a run of
`dsflash bench --profile-step` (scripts/gpu-step-profile.sh), prints the kernels grouped by
name and grid (a GEMV kernel serves several shapes), longest total first, and with --csv
appends them to bench/results.csv as benchmark decode_step_ncu:
  date,commit,machine,benchmark,configuration,metric,value,unit
"""
import argparse
import collections
import csv
import datetime
import re
import sys

COLUMNS = ("Kernel Name", "Grid Size", "Metric Name", "Metric Unit", "Metric Value")
UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def short_name(name):
    """The kernel's name without parameters, return type and anonymous namespaces."""
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # the parameter list: the first '(' outside template brackets
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            cut = i
            break
    name = re.sub(r"^void ", "", name[:cut])
    name = re.sub(r"(\(anonymous namespace\)|<unnamed>)::", "", name)
    name = re.sub(r"\bdsflash::(kernels::)?", "", name)
    return name.replace(" ", "")


def read_kernels(path):
    """(short name, grid, microseconds) of every profiled kernel, in launch order."""
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows:
        raise ValueError(f"{path}: no ncu rows")
    head = rows[0]
    for col in COLUMNS:
        if col not in head:
            raise ValueError(f"{path}: no '{col}' column (ncu --csv output expected)")
    k, g, m, u, v = (head.index(c) for c in COLUMNS)
    out = []
    for r in rows[1:]:
        if len(r) != len(head) or r[m] != "gpu__time_duration.sum":
            continue
        if r[u] not in UNITS:
            raise ValueError(f"{path}: unknown unit '{r[u]}'")
        grid = r[g].strip("()").replace(" ", "").replace(",", "x")
        out.append((short_name(r[k]), grid, float(r[v].replace(",", "")) * UNITS[r[u]]))
    if not out:
        raise ValueError(f"{path}: no gpu__time_duration.sum rows")
    return out


def table(kernels):
    """[(name, grid, launches, total us)], longest total first."""
    agg = collections.defaultdict(lambda: [0, 0.0])
    for name, grid, us in kernels:
        agg[(name, grid)][0] += 1
        agg[(name, grid)][1] += us
    return sorted(((n, g, c, t) for (n, g), (c, t) in agg.items()), key=lambda r: -r[3])


def csv_field(text, always_quote=False):
    """One CSV field (RFC 4180), as tools/dsflash/bench_csv.cc writes it."""
    if always_quote or any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ncu_csv")
    p.add_argument("--csv", help="append rows to this results file")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--machine", default="unknown")
    p.add_argument("--label", default="decode step")
    a = p.parse_args(argv)
    kernels = read_kernels(a.ncu_csv)
    rows = table(kernels)
    total = sum(r[3] for r in rows)
    print(f"{len(kernels)} kernels, {total / 1e3:.3f} ms with each alone on the GPU")
    print(f"{'total us':>10} {'launches':>8} {'us each':>8}  kernel [grid]")
    for name, grid, count, us in rows:
        print(f"{us:10.1f} {count:8d} {us / count:8.2f}  {name} [{grid}]")
    if a.csv:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        config = f"{a.label}; ncu gpu__time_duration, each kernel alone"
        prefix = f"{date},{a.commit},{csv_field(a.machine, True)},decode_step_ncu,{csv_field(config, True)}"
        with open(a.csv, "a") as f:
            f.write(f"{prefix},kernels_total_ms,{total / 1e3:.4f},{csv_field(f'ms per step ({len(kernels)} kernels)')}\n")
            for name, grid, count, us in rows:
                metric = csv_field(f"kernel_{name}_grid{grid}_us")
                f.write(f"{prefix},{metric},{us / count:.3f},{csv_field(f'us per launch ({count} a step)')}\n")
        print(f"appended {len(rows) + 1} rows to {a.csv}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ValueError) as e:
        print(f"ncu_step_table: {e}", file=sys.stderr)
        sys.exit(1)
