"""History and trend: a measured figure over time, its change points, and a verdict against the recent
history (``python -m launcher.history``, docs/health.md#history-and-change-points).

Two kinds of series, one method:

* **Sweeps**: each configuration's throughput over the sweeps of one MLflow experiment. A sweep is a
  parent run, its cells are the parent's child runs (launcher/track/); a configuration is what
  launcher/report/rows.py's ``unit_key`` calls one (its settings without seed, run and where it ran).
* **The node ledger** (launcher/report/health.py): each node's figures over the cluster's probes.

**Change points** are found by E-Divisive means (Matteson and James, 2014), the method MongoDB runs
over its nightly performance results, from its ``signal-processing-algorithms`` package (an optional
install: ``INSTALL``). The series given to it is every independent value in time order (each run of
each sweep, each repeat of each probe), so that its permutation test sees the noise between runs and
not only the sweeps' means; its permutations are seeded, so one history always gives the same change
points. A change point falls on the first value of a new level and is moved to the nearest sweep
boundary. It is kept only where the project's statistics (launcher/report/stats.py) claim that the
values on its two sides differ: Welch's interval excludes no change AND the step is at least the
minimum effect (5% for throughput). That is "a step beyond the noise".

**The verdict** is the latest sweep against the recent history: the sweeps since the last change
point before it (all of them when there is none), their runs pooled, judged with
``stats.difference`` (higher, lower, same by equivalence, or inconclusive with the runs that would
decide it), not against one baseline sweep.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from contract import mlflow_client
from contract.health import NODE_FIGURES
from launcher.report import health, stats
from launcher.report.collect import rows_from_experiment
from launcher.report.rows import joined_label, throughput, unit_key

# The package is kept out of the project's dependencies: its metadata asks for numpy<2 and
# Python<3.12, but the E-Divisive code imports only numpy, structlog and more-itertools.
INSTALL = "pip install structlog more-itertools && pip install --no-deps signal-processing-algorithms==2.1.6"
PVALUE = 0.05  # the permutation test's level (the package's own default)
PERMUTATIONS = 199  # p is counted in steps of 1/(permutations + 1): 0.005 here
SEED = 1234  # the permutations' seed: the same history gives the same change points
MIN_POINTS = 4  # sweeps (or probes) a series needs before it is searched for a change
MIN_EFFECT = stats.MIN_EFFECT["throughput"]  # the smallest step worth a change point or a verdict


class MissingPackage(RuntimeError):
    """signal-processing-algorithms is not installed."""


@dataclass
class Point:
    """One sweep of a configuration (or one probe of a node): its independent values."""

    label: str  # the sweep's name, or the probe's time
    when: str  # ISO 8601, UTC for sweeps
    values: list[float]
    run_id: str | None = None  # the sweep's parent run

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)


@dataclass
class Change:
    """A step between ``before`` and ``after`` (the sweeps on either side), with the values of the
    segments on either side compared (``diff``: after against before)."""

    at: int  # the index of the first point of the new level
    before: Point
    after: Point
    diff: stats.Diff


@dataclass
class History:
    name: str  # the configuration, or "<node> <figure>"
    unit: str
    points: list[Point]
    changes: list[Change] = field(default_factory=list)
    verdict: stats.Diff | None = None  # the latest point against points[since:-1]
    since: int = 0
    note: str = ""  # why there is no verdict
    word: str = "sweep"  # what a point is: a sweep, or a probe of the node ledger

    @property
    def decided(self) -> bool:
        return self.verdict is not None and self.verdict.decided


def _e_divisive():
    try:
        from signal_processing_algorithms.determinism import deterministic_numpy_random
        from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive
    except ImportError as exc:
        raise MissingPackage(f"the change-point search needs MongoDB's signal-processing-algorithms ({exc}). "
                             f"Fix: {INSTALL}") from exc
    return e_divisive, deterministic_numpy_random


def check_installed() -> None:
    """Raises MissingPackage with the command that installs it."""
    _e_divisive()


def _estimate(points: Sequence[Point]) -> stats.Estimate | None:
    return stats.estimate_of([v for p in points for v in p.values])


def change_points(points: Sequence[Point], min_effect: float = MIN_EFFECT, pvalue: float = PVALUE,
                  permutations: int = PERMUTATIONS, seed: int = SEED) -> list[Change]:
    """The steps of the series beyond the noise, oldest first (module docstring)."""
    e_divisive, seeded = _e_divisive()
    series = [v for p in points for v in p.values]
    bounds = [0]
    for p in points:
        bounds.append(bounds[-1] + len(p.values))
    with seeded(seed):  # its permutations draw from numpy's global generator; restored afterwards
        found = e_divisive(series, pvalue=pvalue, permutations=permutations)
    # each value's change moved to the nearest sweep boundary (not the first nor after the last sweep)
    at = sorted({min(range(1, len(points)), key=lambda i: abs(bounds[i] - idx)) for idx in found}) \
        if len(points) > 1 else []
    changes = []
    for k, i in enumerate(at):
        lo = at[k - 1] if k else 0
        hi = at[k + 1] if k + 1 < len(at) else len(points)
        before, after = _estimate(points[lo:i]), _estimate(points[i:hi])
        if before is None or after is None:
            continue
        diff = stats.difference(after, before, min_effect)
        if diff.claimed:
            changes.append(Change(i, points[i - 1], points[i], diff))
    return changes


def analyse(name: str, unit: str, points: Sequence[Point], min_effect: float = MIN_EFFECT,
            word: str = "sweep") -> History:
    """The series' change points and the latest point's verdict against the points since the last
    change before it."""
    points = [p for p in points if p.values]
    found = History(name, unit, list(points), word=word)
    if len(points) < MIN_POINTS:
        found.note = f"{len(points)} {word}(s) with a result: a change needs at least {MIN_POINTS}"
        return found
    found.changes = change_points(points, min_effect)
    found.since = max((c.at for c in found.changes if c.at <= len(points) - 2), default=0)
    latest, recent = _estimate(points[-1:]), _estimate(points[found.since:-1])
    if latest is None or recent is None:
        found.note = "no values to judge"
        return found
    found.verdict = stats.difference(latest, recent, min_effect)
    if not found.verdict.decided:
        found.note = found.verdict.why_inconclusive()
    return found


# ---- the series -------------------------------------------------------------------------------------

def _iso_ms(ms: int | None) -> str:
    return datetime.fromtimestamp((ms or 0) / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def experiment_series(tracking_uri: str, experiment: str) -> tuple[list[tuple[str, list[Point]]], int]:
    """(configuration, its sweeps oldest first) for every configuration of the experiment's sweeps,
    and how many runs were left out for interference (another job on their devices or hosts: the
    report leaves them out of every claim, and so does a history). Raises ReportError for a store or
    experiment that is not there (launcher/report/collect.py)."""
    every = rows_from_experiment(tracking_uri, experiment)
    rows = [r for r in every if not r.get("interference")]
    client = mlflow_client.client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    parents, child_parent, token = {}, {}, None
    while True:  # the sweeps' parent runs (their names and when they started) and each cell's parent
        page = client.search_runs([exp.experiment_id], "", max_results=1000, page_token=token)
        parents.update({r.info.run_id: r for r in page if "mlflow.parentRunId" not in r.data.tags})
        child_parent.update({r.info.run_id: r.data.tags["mlflow.parentRunId"] for r in page
                             if "mlflow.parentRunId" in r.data.tags})
        token = page.token
        if not token:
            break
    for row in rows:
        row["_parent"] = child_parent.get(row["run_id"])
    configs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        if row.get("_parent") in parents:
            configs.setdefault(unit_key(row), {}).setdefault(row["_parent"], []).append(row)
    out = []
    for by_sweep in configs.values():
        members = [r for rs in by_sweep.values() for r in rs]
        points = []
        for parent_id, rs in sorted(by_sweep.items(), key=lambda kv: parents[kv[0]].info.start_time or 0):
            parent = parents[parent_id]
            points.append(Point(parent.data.tags.get("sweep") or parent.info.run_name or parent_id,
                                _iso_ms(parent.info.start_time),
                                [v for r in rs if (v := throughput(r)) is not None], parent_id))
        out.append((joined_label([str(r["cell"]) for r in members]) or str(members[0]["cell"]), points))
    return out, len(every) - len(rows)


def ledger_series(records: Sequence[dict[str, Any]]) -> list[tuple[str, list[Point]]]:
    """("<node> <figure>", its probes oldest first) for every node and figure of the ledger: each
    probe's repeats are the values."""
    hosts = list(dict.fromkeys(h for r in records for h in r["nodes"]))
    out = []
    for host in hosts:
        for figure in NODE_FIGURES:
            points = [Point(r["measured_at"], r["measured_at"],
                            [v for v in r["nodes"][host].get("repeats", {}).get(figure, []) if v and v > 0])
                      for r in records if host in r["nodes"]]
            out.append((f"{host} {figure}", points))
    return out


# ---- what it shows -----------------------------------------------------------------------------------

def _pct(ratio: float) -> str:
    return f"{ratio - 1:+.1%}"


def _verdict_text(h: History) -> str:
    if h.verdict is None:
        return f"undecided: {h.note}"
    v, ref = h.verdict, h.points[h.since:-1]
    against = f"the {len(ref)} {h.word}(s) since {ref[0].when}" if h.since else f"all {len(ref)} earlier {h.word}(s)"
    ci = f" [{_pct(v.low)}, {_pct(v.high)}]" if v.low is not None and v.high is not None else ""
    text = f"{v.verdict}: {_pct(v.ratio)}{ci} against {against} ({v.runs_text()})"
    return text if v.decided else f"{text}; undecided: {h.note}"


def summary(histories: Sequence[History]) -> list[str]:
    """One line per series: its points, its change points (dated, with the sweeps on either side), its verdict."""
    lines = ["| series | points | change points | latest against the recent history |", "|---|---:|---|---|"]
    for h in histories:
        steps = "; ".join(f"{_pct(c.diff.ratio)} at {c.after.when} ({c.before.label} -> {c.after.label})"
                          for c in h.changes) or "none"
        lines.append(f"| {h.name} | {len(h.points)} | {steps} | {_verdict_text(h)} |")
    return lines


def render(title: str, histories: Sequence[History], plot_name: str | None) -> list[str]:
    """The history's report.md: per series, a table of its sweeps, its change points, its verdict."""
    lines = [f"# History: {title}", "",
             f"Change points: E-Divisive means (signal-processing-algorithms, p <= {PVALUE}, {PERMUTATIONS} seeded "
             f"permutations), each kept only where the values on its two sides differ beyond the noise and by at "
             f"least {MIN_EFFECT:.0%} (Welch, launcher/report/stats.py). Verdict: the latest point against the "
             f"points since the last change before it.", ""]
    if plot_name:
        lines += [f"![each series over time, change points dashed]({plot_name})", ""]
    lines += summary(histories)
    for h in histories:
        lines += ["", f"## {h.name}", "", f"| when | {h.word} | values | mean ({h.unit}) | |", "|---|---|---:|---:|---|"]
        starts = {c.at: c for c in h.changes}
        for i, p in enumerate(h.points):
            mark = f"change: {_pct(starts[i].diff.ratio)}" if i in starts else ""
            if i == len(h.points) - 1 and h.verdict is not None:
                mark = (mark + "; " if mark else "") + f"latest: {h.verdict.verdict}"
            elif h.verdict is not None and i >= h.since:
                mark = mark or "recent history"
            lines.append(f"| {p.when} | {p.label} | {len(p.values)} | {p.mean:.4g} | {mark} |")
    return [*lines, ""]


def plot(histories: Sequence[History], out: Path) -> Path | None:
    """One panel per series: each value as a dot, each point's mean joined, change points dashed, the
    recent history shaded."""
    shown = [h for h in histories if h.points]
    if not shown:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(3, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig = Figure(figsize=(5.0 * cols, 3.4 * rows), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot: no global figure state, no GUI backend
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, h in zip(axes, shown, strict=False):
        xs = range(len(h.points))
        for x, p in zip(xs, h.points, strict=True):
            ax.scatter([x] * len(p.values), p.values, s=10, color="tab:blue", alpha=0.5)
        ax.plot(list(xs), [p.mean for p in h.points], color="tab:blue", marker="o")
        for c in h.changes:
            ax.axvline(c.at - 0.5, color="red", ls="--")
        if h.verdict is not None:  # the recent history the latest point (orange) was judged against
            ax.axvspan(h.since - 0.4, len(h.points) - 1.6, color="grey", alpha=0.15)
            ax.plot([len(h.points) - 1], [h.points[-1].mean], marker="o", color="tab:orange")
        ax.set_xticks(list(xs), [p.when[:16] for p in h.points], rotation=45, ha="right", fontsize=6)
        ax.set_title(h.name[:60] + (f": latest {h.verdict.verdict}" if h.verdict is not None else ""), fontsize=8)
        ax.set_ylabel(h.unit, fontsize=8)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    return out


def write(out_dir: Path, title: str, histories: Sequence[History]) -> tuple[Path, Path | None]:
    """report.md and history.png in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    picture = plot(histories, out_dir / "history.png")
    report = out_dir / "report.md"
    report.write_text("\n".join(render(title, histories, picture.name if picture else None)))
    return report, picture


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def ledger_histories(ledger: Path) -> list[History]:
    return [analyse(name, name.split(" ", 1)[1], points, word="probe")
            for name, points in ledger_series(health.read(ledger))]
