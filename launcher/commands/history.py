"""``python -m launcher.history``: each configuration's throughput over the sweeps of an MLflow experiment,
or each node's figures over the probes of a node ledger, with change points and a verdict against the
recent history (launcher/report/history.py; docs/health.md#history-and-change-points).

    python -m launcher.history ddp-vs-fsdp [--tracking-uri URI] [--out DIR]
    python -m launcher.history --ledger outputs/health-slurm_debug.jsonl [--tracking-uri URI] [--out DIR]

It writes report.md and history.png (to --out; default: history/<experiment> beside the store, or
<ledger>-history/ beside the ledger) and attaches both to MLflow: to the latest sweep's parent run, or
to the latest probe's run of the cluster's health experiment, under history/.

Exit status: 0 when every series with enough points has a verdict (higher, lower or same), 3 when
some verdict is undecided, 2 when the input is refused (no such experiment or ledger, too few sweeps,
the change-point package missing: the command that installs it is printed), 1 on a failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from contract import mlflow_client
from launcher.commands.command import FAILURE_EXIT, UNDECIDED_EXIT, USER_ERROR_EXIT, Command, Parser, Refused
from launcher.report import health
from launcher.report import history as hist
from launcher.report.collect import ReportError
from launcher.track import tracking


class HistoryCommand(Command):
    name = "history"

    def add_arguments(self, p: Parser) -> None:
        p.add_argument("experiment", nargs="?", help="the MLflow experiment whose sweeps to follow")
        p.add_argument("--ledger", help="a node ledger (health-<cluster>.jsonl) instead of an experiment")
        p.add_argument("--tracking-uri", help="the MLflow store (default: $MLFLOW_TRACKING_URI, else "
                                              "sqlite:///outputs/mlflow.db; for --ledger, the mlflow.db beside it)")
        p.add_argument("--out", help="where report.md and history.png go")

    def run(self, args: argparse.Namespace) -> int:
        _refuse(args)
        try:
            hist.check_installed()
        except hist.MissingPackage as exc:
            print(f"error: {exc}", file=sys.stderr)
            return USER_ERROR_EXIT
        if args.ledger:
            return _ledger(Path(args.ledger), args.tracking_uri, args.out)
        return _experiment(args.experiment, args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                           or tracking.default_uri(Path("outputs")), args.out)


main = HistoryCommand.main


def _refuse(args: argparse.Namespace) -> None:
    """What the command line asks for, refused before anything is read where it cannot be done."""
    if bool(args.experiment) == bool(args.ledger):
        raise Refused("pass an MLflow experiment or --ledger PATH (one of them); nothing was read or written. Fix: "
                      "see python -m launcher.history --help.")
    if args.out is not None and (not args.out.strip() or (Path(args.out).exists() and not Path(args.out).is_dir())):
        raise Refused(f"--out={args.out!r}: {'is empty' if not args.out.strip() else 'is a file'}, and the report "
                      "goes into a directory; nothing was written. Fix: give a directory (it is made where it is "
                      "missing), or drop --out for the default.")
    if args.ledger is not None and Path(args.ledger).is_dir():
        raise Refused(f"--ledger={args.ledger!r}: is a directory. Fix: pass the ledger file, "
                      f"health-<cluster>.jsonl, in it.")


def _refuse_if_short(histories: list[hist.History], what: str) -> int | None:
    most = max((len(h.points) for h in histories), default=0)
    if most >= hist.MIN_POINTS:
        return None
    print(f"error: {what}: at most {most} {'probe' if 'ledger' in what else 'sweep'}(s) of one series with a result; "
          f"a history needs at least {hist.MIN_POINTS}. Fix: run {hist.MIN_POINTS - most} more, then ask again.",
          file=sys.stderr)
    return USER_ERROR_EXIT


def _experiment(name: str, uri: str, out: str | None) -> int:
    try:
        series, flagged = hist.experiment_series(uri, name)
    except ReportError as exc:  # its fix names the report's --experiment: here it is the first argument
        print(f"error: {str(exc).replace('pass --experiment with', 'pass as EXPERIMENT')}", file=sys.stderr)
        return USER_ERROR_EXIT
    histories = [hist.analyse(label, "samples/s", points) for label, points in series]
    if flagged:
        print(f"left out: {flagged} run(s) flagged for interference (another job on their devices or hosts), as the "
              f"report leaves them out", flush=True)
    refused = _refuse_if_short(histories, f"experiment {name!r}")
    if refused is not None:
        return refused
    store = tracking.sqlite_path(uri)
    out_dir = Path(out) if out else (store.parent if store else Path("outputs")) / "history" / hist.safe_name(name)
    report, picture = hist.write(out_dir, f"experiment {name}", histories)
    latest = max((p for h in histories for p in h.points), key=lambda p: p.when)
    return _said(histories, report, picture, uri, latest.run_id)


def _ledger(ledger: Path, uri: str | None, out: str | None) -> int:
    if not ledger.is_file():
        raise Refused(f"--ledger={str(ledger)!r}: no such file. Fix: pass a ledger written by python -m "
                      f"launcher.health (health-<cluster>.jsonl in its output_root).")
    records = health.read(ledger)
    if not records:
        print(f"error: {ledger} holds no readable probe. Fix: pass a ledger written by python -m launcher.health "
              f"(health-<cluster>.jsonl beside the store).", file=sys.stderr)
        return USER_ERROR_EXIT
    histories = hist.ledger_histories(ledger)
    refused = _refuse_if_short(histories, f"ledger {ledger}")
    if refused is not None:
        return refused
    report, picture = hist.write(Path(out) if out else health.history_dir(ledger), f"node ledger {ledger.name}",
                                 histories)
    beside = ledger.parent / "mlflow.db"
    uri = uri or (tracking.default_uri(ledger.parent) if beside.exists() else None)
    run_id = None
    if uri:
        found = mlflow_client.client(uri).get_experiment_by_name(f"health-{records[-1]['cluster']}")
        runs = mlflow_client.client(uri).search_runs([found.experiment_id], "", max_results=1,
                                                     order_by=["attributes.start_time DESC"]) if found else []
        run_id = runs[0].info.run_id if runs else None
    return _said(histories, report, picture, uri, run_id)


def _said(histories: list[hist.History], report: Path, picture: Path | None, uri: str | None,
          run_id: str | None) -> int:
    print("\n".join(hist.summary(histories)))
    print(f"report: {report}" + (f"; plot: {picture}" if picture else ""))
    if uri and run_id:
        try:
            tracking.attach(uri, run_id, [p for p in (report, picture) if p], "history")
        except Exception as exc:  # the files are written; only their copy in MLflow is missing
            print(f"error: could not attach the history to MLflow run {run_id} at {uri}: {exc}", file=sys.stderr)
            return FAILURE_EXIT
        print(f"attached to MLflow run {run_id} (artifacts: history/)")
    else:
        print("no MLflow run to attach it to (no store, or no run in it)")
    judged = [h for h in histories if len(h.points) >= hist.MIN_POINTS]
    return 0 if all(h.decided for h in judged) else UNDECIDED_EXIT
