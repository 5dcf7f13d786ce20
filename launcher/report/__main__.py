"""``python -m launcher.report``: the report's command line.

    python -m launcher.report <sweep_dir>
    python -m launcher.report --experiment ddp-vs-fsdp [--tracking-uri URI] [--out DIR]
    python -m launcher.report --compare A B [--threshold 0.05] [--gate] [--tracking-uri URI]

A sweep directory is finished as status and sync finish it (launcher/finish.py), which writes its
report; an experiment's report and a comparison only read and write (launcher/report/report.py,
compare.py). This is a command: it sits after launcher.finish in the flow, and no module imports it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from launcher.cli import guarded
from launcher.finish import finalize
from launcher.report import compare, noisefloor, stats
from launcher.report.report import (
    ReportError,
    collect,
    floor_key,
    looks_of,
    rows_from_parent_run,
    write_experiment_report,
)
from launcher.state import StateError, SweepState


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher.report",
        description="Write report.md (ranking table, plots, how measured, environment, failures) for one sweep "
                    "directory, or for every sweep logged to an MLflow experiment.")
    p.add_argument("sweep_dir", nargs="?", help="a sweep directory (holds sweep.json); report.md goes there")
    p.add_argument("--experiment", help="report on every cell run of this MLflow experiment instead")
    p.add_argument("--tracking-uri", help="MLflow store of --experiment (default: $MLFLOW_TRACKING_URI, else "
                                          "sqlite:///outputs/mlflow.db, the launcher's default)")
    p.add_argument("--out", help="directory for --experiment's report (default: outputs/reports/<experiment>)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="compare sweep B with sweep A, cell by cell: two sweep directories or MLflow parent run ids "
                        "(with --tracking-uri); exit 1 when a regression exceeds --threshold")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="--compare: the relative regression that fails the command, and the margin of \"no change\" "
                        "(default 0.05 = 5%%)")
    p.add_argument("--gate", action="store_true",
                   help="--compare: a regression gate that passes only on a positive result: exit 0 when every "
                        "configuration's throughput is shown to be no change (within --threshold) or an improvement, "
                        "1 on a regression, 3 when some are undecided")
    return p


def _tracking_uri(arg: str | None) -> str:
    return arg or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path('outputs', 'mlflow.db').resolve()}"


def rows_of(source: str, tracking_uri: str | None) -> tuple[list[dict[str, Any]], stats.Floor | None]:
    """The rows of one sweep (a sweep directory, else an MLflow parent run id) and its cluster's
    noise floor (sweep directories only)."""
    if Path(source, "sweep.json").exists():
        state = SweepState.load(Path(source))
        return collect(state), noisefloor.load(state.path.parent, floor_key(state))
    if Path(source).exists():
        raise ReportError(f"{source} holds no sweep.json: pass a sweep directory or a parent run id.")
    return rows_from_parent_run(_tracking_uri(tracking_uri), source), None


def main_compare(a: str, b: str, threshold: float, tracking_uri: str | None, gate: bool = False) -> int:
    (rows_a, floor_a), (rows_b, floor_b) = rows_of(a, tracking_uri), rows_of(b, tracking_uri)
    floor = floor_b or floor_a  # the newer sweep's cluster first; both ran on one cluster to be comparable
    result = compare.compare(rows_a, rows_b, threshold, floor, baseline_looks(a, b))
    print(compare.render(result, a, b))
    if floor:
        print(f"noise floor for single runs: {floor.where}")
    if gate:
        passed, why = result.gate()
        print(why)
        return 0 if passed else 1 if result.regressions() else 3
    return 1 if result.regressions() else 0


def baseline_looks(a: str, b: str) -> stats.Looks | None:
    """B's planned looks when B ran with runs=auto against A as its baseline: its rounds were looks at
    these very comparisons. Otherwise None: one look at the final runs."""
    if not Path(b, "sweep.json").exists() or not Path(a, "sweep.json").exists():
        return None
    state = SweepState.load(Path(b))
    design = state.design
    if design is None or not design.baseline or Path(design.baseline).resolve() != Path(a).resolve():
        return None
    return looks_of(state)


def _compare_command(args: argparse.Namespace) -> int:
    if args.sweep_dir or args.experiment:
        print("error: --compare takes its two sweeps itself; pass no sweep directory or --experiment.",
              file=sys.stderr)
        return 2
    try:
        first, second = args.compare
        return main_compare(first, second, args.threshold, args.tracking_uri, args.gate)
    except (ReportError, StateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _report_command(args: argparse.Namespace) -> int:
    try:
        if args.sweep_dir:
            # The finishing step, as status and sync reach it: Slurm's states, interference, MLflow.
            print(finalize(SweepState.load(Path(args.sweep_dir))))
            return 0
        uri = _tracking_uri(args.tracking_uri)
        out = Path(args.out) if args.out else Path("outputs", "reports", args.experiment)
        report = write_experiment_report(uri, args.experiment, out)
    except (ReportError, StateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.tables)
    print(f"\nreport: {report.path}")
    return 0


@guarded
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.compare:
        return _compare_command(args)
    if bool(args.sweep_dir) == bool(args.experiment):
        _parser().print_usage(sys.stderr)
        print("error: pass a sweep directory or --experiment NAME (one of them).", file=sys.stderr)
        return 2
    return _report_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
