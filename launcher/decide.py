"""``runs=auto``: after each round, runs are added only where a comparison is still open.

    round 1: runs_min runs of every grid point (interleaved, as fixed runs)
      -> every cell ended -> the comparisons judged at this look (the findings' pairs, and with a
         baseline the pairs of ``--compare baseline this``; launcher/report/sequential.py)
      -> open ones: their configurations get the next round's runs (the schedule's next count)
      -> ... until none is open, runs_max is reached, or the wall-time budget would be overrun.

Strategies at one rank are not followed: nothing is sharded or sent there, the report never claims
that comparison as a strategy result (only the wrappers' cost), so no run is spent on it.

A comparison is open while it is undecided, below runs_max, and decidable within runs_max at the
noise seen (a comparison that would need more runs than runs_max stops early: more runs would
not decide it). The local launcher runs the rounds in its foreground; on Slurm, where the launcher
returns at once, ``launcher.status`` (or ``--wait``) submits the next round once the last has
ended. This module decides and plans the cells; the callers submit them.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster.backends import backend_for
from launcher.forecast import timelimit
from launcher.plan.cell import Cell, CellStatus, configuration
from launcher.plan.planner import cell_dirname
from launcher.plan.schema import AUTO, Config
from launcher.report import compare, comparisons, noisefloor
from launcher.report.collect import collect, looks_of
from launcher.report.noisefloor import floor_key
from launcher.report.rows import grouped
from launcher.report.stats import MIN_EFFECT, Diff, Drift, Looks, sequential_difference, stop_reason
from launcher.state import Design, Round, SweepState
from launcher.track.runs import ensure_runs


@dataclass
class Pair:
    """One comparison the design follows: its label, the configurations of this sweep it involves,
    its verdict at the latest look, and why no more runs come to it (None: open)."""

    label: str
    configurations: list[str]
    diff: Diff
    stopped: str | None


def design_for(config: Config) -> Design | None:
    """The sweep's design from its (uniform) settings: None for fixed runs."""
    if not config.auto:
        return None
    baseline = str(Path(config.baseline).resolve()) if config.baseline else None
    budget_min = config.cluster.runs_budget_min() if config.runs_budget_min == AUTO else config.runs_budget_min
    return Design(runs_min=config.runs_min, runs_max=config.resolved_runs_max, budget_min=budget_min,
                  baseline=baseline, started_s=time.time(), cells_max=config.limits.cells)


def first_round(state: SweepState) -> None:
    """Record round 1: every cell planned (the runs_min runs of each grid point)."""
    if state.design is not None and not state.design.rounds:
        state.design.rounds.append(Round(1, state.design.runs_min, [c.index for c in state.cells], time.time()))


def pairs(state: SweepState, unjudged: list[str] | None = None) -> list[Pair]:
    """Every comparison the design follows, judged at the looks so far; ``unjudged`` collects why
    the findings' comparisons that cannot be judged are left out (a side without a result, or a
    cell flagged for interference: more runs would not make those claims)."""
    looks = looks_of(state)
    rows = collect(state)
    units = grouped(rows)
    out = []
    for axis in comparisons.AXES:
        for c in comparisons.comparisons(units, axis, looks=looks):
            if c.throughput is None or c.caveat:
                if unjudged is not None:
                    unjudged.append(c.caveat or f"{c.a_label} vs {c.b_label}: a side has no result")
                continue
            if c.wrappers_only:  # never claimed as a strategy result: more runs would decide nothing asked
                if unjudged is not None:
                    unjudged.append(f"{c.a_label} vs {c.b_label} at 1 rank: not followed, the wrappers' cost, not a strategy result")
                continue
            names = [configuration(str(m["cell"])) for side in (c.a, c.b) for m in side.get("_members", [side])]
            label = f"{c.a_label} vs {c.b_label} at {c.world_size} rank(s)" + (f", {c.context}" if c.context else "")
            out.append(Pair(label, sorted(set(names)), c.throughput, stop_reason(c.throughput, looks)))
    if state.design is not None and state.design.baseline:
        drift = noisefloor.load_drift(state.path.parent, floor_key(state))
        out += _baseline_pairs(state.design.baseline, rows, looks, unjudged, drift)
    return out


def _baseline_pairs(baseline: str, rows: list[dict], looks: Looks, unjudged: list[str] | None,
                    drift: Drift | None = None) -> list[Pair]:
    """This sweep's configurations against the baseline sweep's, by the one rule of --compare
    (launcher/report/compare.py): only comparable pairs, the family's alpha split over its rows, and
    the sweep-to-sweep drift in the noise (the cluster's record pooled with the default allowance,
    stats.sweep_drift): the same interval as --compare, so a pair whose drift alone is wider than its
    change stops at once ("cannot decide: drift between sweeps dominates") instead of asking for runs."""
    result = compare.compare(collect(SweepState.load(baseline)), rows, MIN_EFFECT["throughput"], looks=looks,
                             drift=drift)
    if unjudged is not None:
        unjudged += [f"{m.name} against the baseline: not compared, {m.why_not}" for m in result.not_compared]
    row_looks = dataclasses.replace(looks, alpha=result.row_alpha)
    out = []
    for m in result.matches:
        if caveat := m.caveat:  # flagged: more runs would not make the claim
            if unjudged is not None:
                unjudged.append(f"{m.name} against the baseline: not claimed, {caveat}")
            continue
        d = sequential_difference(m.b, m.a, "throughput", MIN_EFFECT["throughput"], row_looks, drift=result.drift)
        if d is None:
            continue
        names = sorted({configuration(str(r["cell"])) for r in m.b.get("_members", [m.b])})
        out.append(Pair(f"{m.name} against the baseline", names, d, stop_reason(d, row_looks)))
    return out


def next_round(state: SweepState, now_s: float | None = None) -> list[Cell]:
    """After a round has ended: the cells of the next one (planned, saved, not submitted), or [] with
    ``design.stopped`` saying why no round follows."""
    design = state.design
    if design is None or design.stopped or not all(c.status.terminal for c in state.cells):
        return []
    now_s = time.time() if now_s is None else now_s
    looks = looks_of(state)
    unjudged: list[str] = []
    found = pairs(state, unjudged)
    open_ = [p for p in found if p.stopped is None]
    done = len(design.rounds)
    why = _why_stop(state, design, looks, found, open_, done, now_s, unjudged)
    if why:
        design.stopped = why
        state.save()
        return []
    wanted = {name for p in open_ for name in p.configurations}
    target = looks.schedule[done]
    adding = sum(max(0, target - _runs_of(state, name)) for name in wanted)
    if design.cells_max is not None and len(state.cells) + adding > design.cells_max:
        design.stopped = (f"limits.cells={design.cells_max} reached: round {done + 1} would add {adding} run(s) to the "
                          f"{len(state.cells)} run so far")
        state.save()
        return []
    hosts = _hosts(state)
    cells = [_another_run(state, name, target, hosts) for name in _in_plan_order(state, wanted)]
    added = [c for group in cells for c in group]
    design.rounds.append(Round(done + 1, target, [c.index for c in added], now_s, [p.label for p in open_]))
    state.save()
    return added


def _why_stop(state: SweepState, design: Design, looks: Looks, found: list[Pair], open_: list[Pair], done: int,
              now_s: float, unjudged: list[str]) -> str | None:
    left_out = (f"; {len(unjudged)} comparison(s) not judged ({unjudged[0]}"
                + (" ..." if len(unjudged) > 1 else "") + ")") if unjudged else ""
    if not found:
        if len({configuration(c.name) for c in state.cells}) == 1 and not design.baseline:
            return (f"one configuration and no baseline: nothing to compare; its {design.runs_min} runs measure its "
                    f"spread (sweep a setting, e.g. strategy=ddp,fsdp, or give baseline=<a sweep directory>)")
        return "no comparison can be judged" + (left_out or ": no two configurations with a result differ in one "
                                                "setting")
    if not open_:
        return f"every comparison decided or stopped after round {done}{left_out}"
    if done >= looks.rounds:
        return f"runs_max={design.runs_max} reached"
    if design.budget_min is not None:
        last = design.rounds[-1]
        spent_s = now_s - design.started_s
        # The last round's pace: one cell after another in the foreground, all at once on a cluster.
        round_s = now_s - last.started_s
        if backend_for(state.cluster).runs_cells_in_foreground:
            wanted = {n for p in open_ for n in p.configurations}
            next_s = _next_round_s(state, last, round_s,
                                   {name: max(0, looks.schedule[done] - _runs_of(state, name)) for name in wanted})
        else:
            next_s = round_s
        if spent_s + next_s > design.budget_min * 60:
            return (f"budget: round {done + 1} (about {next_s / 60:.1f} min) would end after "
                    f"runs_budget_min={design.budget_min:g} ({spent_s / 60:.1f} min spent)")
    return None


def _next_round_s(state: SweepState, last: Round, round_s: float, adding: dict[str, int]) -> float:
    """The next round's wall time in the foreground, ``adding`` runs per configuration: each at the
    pace its runs had in the last round (timelimit.round_pace_s); a configuration not in the last
    round at the round's mean pace."""
    in_round = set(last.cells)
    cells = [c for c in state.cells if c.index in in_round]
    pace_s = timelimit.round_pace_s(state, cells, round_s, lambda c: configuration(c.name))
    return sum(n * pace_s(name) for name, n in adding.items())


def _runs_of(state: SweepState, name: str) -> int:
    return max((c.run for c in state.cells if configuration(c.name) == name), default=0)


def _in_plan_order(state: SweepState, names: set[str]) -> list[str]:
    order: list[str] = []
    for cell in state.cells:
        name = configuration(cell.name)
        if name in names and name not in order:
            order.append(name)
    return order


def _hosts(state: SweepState) -> dict[int, set[str]]:
    """The nodes each finished cell ran on (its ranks' host names, Slurm's node names on Slurm)."""
    out = {}
    for cell in state.cells:
        found = state.read_result(cell).get("tags", {}).get("hostnames") if cell.status is CellStatus.done else None
        if found:
            out[cell.index] = set(str(found).split(","))
    return out


def _another_run(state: SweepState, name: str, target: int, hosts: dict[int, set[str]]) -> list[Cell]:
    """Runs of configuration ``name`` up to ``target``, each a copy of its latest run's cell and spec,
    placed away from the nodes its earlier runs used where others are left (Backend.placing_apart: on
    Slurm, launcher/cluster/slurm/spread.py)."""
    mine = [c for c in state.cells if configuration(c.name) == name]
    used = set().union(*(hosts.get(c.index, set()) for c in mine))
    seen = set().union(*hosts.values()) if hosts else set()
    source = max(mine, key=lambda c: c.run)
    backend = backend_for(state.cluster)
    # cluster.timeout_min=auto: a further run asks for what the runs of its configuration used.
    limit = timelimit.after_runs(state, mine) if source.time_asked is not None else None
    added = []
    for run in range(source.run + 1, target + 1):
        index = len(state.cells)
        full = f"{name} run={run}"
        cell = dataclasses.replace(
            source, index=index, name=full, dirname=cell_dirname(index, full), run=run, job_id=None, run_id=None,
            status=CellStatus.planned, error=None, failure_class=None, interference=None, resubmits=0,
            submitted_at=None, restarts=0, history=[], cluster=dataclasses.replace(source.cluster),
            resolved=None, time_used_s=None)
        if limit is not None:
            cell.cluster.timeout_min, cell.time_asked = limit.minutes, limit.how
        backend.placing_apart(cell, used, seen)
        state.cells.append(cell)
        spec = state.load_spec(source)
        state.save_spec(cell, dataclasses.replace(spec, cell=full, out_dir=str(state.cell_dir(cell)), run_id=None))
        config_yaml = state.cell_dir(source) / "config.yaml"
        if config_yaml.exists():
            text = config_yaml.read_text().split("\n", 1)
            (state.cell_dir(cell) / "config.yaml").write_text(f"# {full}\n{text[1] if len(text) > 1 else ''}")
        added.append(cell)
    return added


def summary(state: SweepState) -> str:
    """What the design did: runs per configuration, rounds, and why it stopped (for the terminal)."""
    design = state.design
    if design is None:
        return ""
    runs: dict[str, int] = {}
    for cell in state.cells:
        runs[configuration(cell.name)] = runs.get(configuration(cell.name), 0) + 1
    per = ", ".join(f"{name}: {n}" for name, n in runs.items())
    stopped = design.stopped or "a round is running"
    return (f"runs=auto: {len(design.rounds)} round(s), {len(state.cells)} runs ({per}); stopped: {stopped}")


def advance(state: SweepState, stream=sys.stdout) -> list[Cell]:
    """Once every cell has ended: submit the next round where comparisons are still open, so that a
    Slurm sweep needs no process waiting for it (launcher.status and --wait call it). Returns its
    cells. A local sweep runs its rounds in its launcher's foreground (its command, run again,
    resumes it): status never starts benchmarks on this machine behind the user's back."""
    backend = backend_for(state.cluster)
    if backend.runs_cells_in_foreground:
        return []
    added = next_round(state)
    if not added:
        return []
    if backend.worker_tracking_uri(state):
        ensure_runs(state)  # the ranks log into their runs themselves: the runs exist first
    last = state.design.rounds[-1] if state.design else None
    print(f"runs=auto: round {last.number if last else '?'} submits {len(added)} run(s) for "
          f"{len(last.open) if last else 0} open comparison(s)", file=stream, flush=True)
    backend.submit(state, added)  # a background backend: its cells' runs are settled by status
    state.save()
    return added
