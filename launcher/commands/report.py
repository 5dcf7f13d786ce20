"""``python -m launcher.report``: the report's command line.

    python -m launcher.report <sweep_dir>
    python -m launcher.report --experiment ddp-vs-fsdp [--tracking-uri URI] [--out DIR]
    python -m launcher.report --compare A B [--threshold 0.05] [--gate] [--tracking-uri URI]
    python -m launcher.report --compare A B --record-drift     # A and B: an A/A pair of sweeps

Exit codes (docs/troubleshooting.md): 0 done as asked, 2 a refused input, 1 a failure or a
regression, 3 undecided (``--gate`` not passed without a regression; ``--compare`` where no row of
throughput, step time or peak memory could be judged).

A sweep directory is finished as status and sync finish it (launcher/finish.py), which writes its
report; an experiment's report and a comparison only read and write (launcher/report/markdown.py,
compare.py). This is a command: it sits after launcher.finish in the flow, and no module imports it.
``python -m launcher.report`` reaches it through its entry shim, launcher/report/__main__.py.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from contract.spec import ConfigError
from launcher.commands.command import FAILURE_EXIT, UNDECIDED_EXIT, USER_ERROR_EXIT, Command, Parser
from launcher.finish import finalize
from launcher.plan import shellsafe
from launcher.report import compare, comparetable, noisefloor, stats
from launcher.report.collect import ReportError, collect, looks_of, rows_from_parent_run
from launcher.report.markdown import write_experiment_report
from launcher.report.noisefloor import floor_key
from launcher.state import StateError, SweepState

THRESHOLD = 0.05  # --compare's default: the regression that fails it, the margin of "no change"


class ReportCommand(Command):
    name = "report"

    def add_arguments(self, p: Parser) -> None:
        p.add_argument("sweep_dir", nargs="?", help="a sweep directory (holds sweep.json); report.md goes there")
        p.add_argument("--experiment", help="report on every cell run of this MLflow experiment instead")
        p.add_argument("--tracking-uri", help="MLflow store of --experiment (default: $MLFLOW_TRACKING_URI, else "
                                              "sqlite:///outputs/mlflow.db, the launcher's default)")
        p.add_argument("--out", help="directory for --experiment's report (default: outputs/reports/<experiment>)")
        p.add_argument("--compare", nargs=2, metavar=("A", "B"),
                       help="compare sweep B with sweep A, cell by cell: two sweep directories or MLflow parent run "
                            "ids (with --tracking-uri); exit 1 when a regression exceeds --threshold")
        p.add_argument("--threshold", type=float, default=THRESHOLD,
                       help="--compare: the relative regression that fails the command, and the margin of \"no "
                            "change\" (default 0.05 = 5%%)")
        p.add_argument("--gate", action="store_true",
                       help="--compare: a regression gate that passes only on a positive result: exit 0 when every "
                            "configuration's throughput is shown to be no change (within --threshold) or an "
                            "improvement, 1 on a regression, 3 when some are undecided")
        p.add_argument("--record-drift", action="store_true",
                       help="--compare: A and B are an A/A pair (the same settings, run one after the other on one "
                            "cluster): record how far they differ as the cluster's sweep-to-sweep drift, which later "
                            "comparisons count in their noise")

    def run(self, args: argparse.Namespace) -> int:
        if args.compare:
            return _compare_command(args)
        given = [flag for flag, on in (("--gate", args.gate), ("--record-drift", args.record_drift),
                                       ("--threshold", args.threshold != THRESHOLD)) if on]
        if given:
            print(f"error: {', '.join(given)} only mean(s) something with --compare A B; nothing was read or "
                  f"written. Fix: add --compare A B, or drop {', '.join(given)}.", file=sys.stderr)
            return USER_ERROR_EXIT
        if bool(args.sweep_dir) == bool(args.experiment):
            print("error: pass a sweep directory or --experiment NAME (one of them); nothing was read or written. "
                  "Fix: see python -m launcher.report --help.", file=sys.stderr)
            return USER_ERROR_EXIT
        return _report_command(args)


main = ReportCommand.main


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


def _same_sweep(a: str, b: str) -> bool:
    if a == b:
        return True
    if Path(a, "sweep.json").exists() and Path(b, "sweep.json").exists():
        return Path(a).resolve() == Path(b).resolve()
    return False


def _where(source: str) -> tuple[Path, str] | None:
    """A sweep directory's output root and cluster key (where its shared records are kept)."""
    if not Path(source, "sweep.json").exists():
        return None
    state = SweepState.load(Path(source))
    return state.path.parent, floor_key(state)


def main_compare(a: str, b: str, threshold: float, tracking_uri: str | None, gate: bool = False,
                 record_drift: bool = False) -> int:
    if _same_sweep(a, b):
        raise ReportError(f"--compare {a} {b}: a sweep compared with itself tells nothing (every difference is zero "
                          "by construction). Fix: pass two different sweeps, the older first; for an A/A check run "
                          "the same command twice and compare the two sweeps.")
    (rows_a, floor_a), (rows_b, floor_b) = rows_of(a, tracking_uri), rows_of(b, tracking_uri)
    floor = floor_b or floor_a  # the newer sweep's cluster first; both ran on one cluster to be comparable
    where = _where(b) or _where(a)
    if record_drift and (not _where(a) or not _where(b) or _where(a) != _where(b)):
        raise ReportError("--record-drift: both sweeps must be sweep directories under one output root, of one "
                          "cluster (the drift is kept per cluster beside them). Fix: pass two sweep directories that "
                          "ran on the same cluster, one after the other.")
    drift = noisefloor.load_drift(*where) if where else None
    result = compare.compare(rows_a, rows_b, threshold, floor, baseline_looks(a, b), drift)
    if record_drift:
        return _record_drift(a, b, result, where)
    print(comparetable.render(result, a, b))
    if floor:
        print(f"noise floor for single runs: {floor.where}")
    if gate:
        passed, why = result.gate()
        print(why)
        return 0 if passed else FAILURE_EXIT if result.regressions() else UNDECIDED_EXIT
    if result.regressions():
        return FAILURE_EXIT
    if not result.judged():
        print(f"undecided: no row of {a} against {b} could be judged ({_why_undecided(result)}); exit 3, not a "
              "pass. Fix: see each row's note above (more runs, a quiet machine, comparable settings).",
              file=sys.stderr)
        return UNDECIDED_EXIT
    return 0


def _why_undecided(result: compare.Comparison) -> str:
    parts = [f"{n} {what}" for n, what in (
        (len(result.inconclusive()), "row(s) inconclusive"),
        (sum(1 for m in result.matches for d in m.deltas if d.verdict == compare.NOT_CLAIMED), "row(s) not claimed"),
        (len(result.not_compared), "pair(s) not comparable"),
        (len(result.only_a) + len(result.only_b), "configuration(s) in one sweep only"),
        (result.running, "cell(s) not ended")) if n]
    return ", ".join(parts) or "nothing matched"


def _record_drift(a: str, b: str, result: compare.Comparison, where: tuple[Path, str] | None) -> int:
    """Keep an A/A pair's differences as the cluster's drift: only a pair whose every configuration
    matched by its settings, ran and ended on both sides."""
    problems = [f"{m.name}: {m.why_not}" for m in result.not_compared]
    problems += [f"{m.name}: matched by name only (its settings differ)" for m in result.matches if m.by == "name"]
    problems += [f"{compare.row_name(r)}: only in one sweep" for r in [*result.only_a, *result.only_b]]
    if result.running:
        problems.append(f"{result.running} cell(s) have not ended")
    if problems or where is None:
        raise ReportError("--record-drift takes an A/A pair: two sweeps of the same settings, both ended; these are "
                          f"not ({'; '.join(problems[:4])}). Fix: run the same command twice, one after the other, "
                          "and pass the two sweep directories once both have ended.")
    entries = noisefloor.drift_entries([(m.a, m.b) for m in result.matches])
    if not entries:
        flagged = sum(1 for m in result.matches if m.caveat)
        raise ReportError(f"--record-drift: no configuration of {a} and {b} was measured in {noisefloor.MIN_RUNS} or "
                          f"more runs on both sides without interference ({flagged} of {len(result.matches)} flagged), "
                          f"so the drift between quiet sweeps cannot be told from their runs' own noise or another "
                          f"job's load. Fix: run the A/A pair with runs={noisefloor.MIN_RUNS} or more on a quiet machine "
                          f"(or on whole nodes).")
    drift = noisefloor.record_drift(where[0], where[1], entries, f"{Path(a).name} vs {Path(b).name}")
    if drift is None:
        print(f"error: the drift record in {where[0] / noisefloor.DRIFT_FILE} could not be written.", file=sys.stderr)
        return FAILURE_EXIT
    print(f"recorded {len(entries)} A/A entries; sweep-to-sweep drift on {where[1]}: "
          + ", ".join(f"{k} {v:.1%}" for k, v in sorted(drift.cv.items())) + f" ({drift.where}; "
          f"{where[0] / noisefloor.DRIFT_FILE})")
    return 0


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
        return USER_ERROR_EXIT
    if not math.isfinite(args.threshold) or not 0 < args.threshold < 1:
        print(f"error: --threshold {args.threshold} is not a relative change between 0 and 1. Fix: use e.g. "
              "--threshold 0.05 (5%).", file=sys.stderr)
        return USER_ERROR_EXIT
    if args.gate and args.record_drift:
        print("error: --gate and --record-drift do not go together: an A/A pair recorded as drift is not gated. "
              "Fix: record the drift first, then gate the comparison you mean.", file=sys.stderr)
        return USER_ERROR_EXIT
    try:
        first, second = args.compare
        return main_compare(first, second, args.threshold, args.tracking_uri, args.gate, args.record_drift)
    except (ReportError, StateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT


def _report_command(args: argparse.Namespace) -> int:
    try:
        if args.sweep_dir:
            # The finishing step, as status and sync reach it: Slurm's states, interference, MLflow.
            print(finalize(SweepState.load(Path(args.sweep_dir))))
            return 0
        if not args.out:  # the experiment names a directory under outputs/reports: it must stay there
            shellsafe.check("--experiment", args.experiment, "name")
        uri = _tracking_uri(args.tracking_uri)
        out = Path(args.out) if args.out else Path("outputs", "reports", args.experiment)
        report = write_experiment_report(uri, args.experiment, out)
    except (ReportError, StateError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    print(report.tables)
    print(f"\nreport: {report.path}")
    return 0
