"""A node health probe from asking to keeping: the nodes, the job through the backend, the verdicts,
the ledger and the MLflow run. Shared by ``python -m launcher.health`` and a sweep's ``health=auto``.

The job (jobs/nodeprobe.py) is one task per node, submitted through the backend's seam
(``Backend.run_health``, as the fabric probe's ``start_probe``) and waited for; on Slurm a partition of
more than ``nodes_per_job`` nodes is probed in several jobs, one after another, each its own ring.
Which nodes a probe covers and how flagged nodes are kept out of the cells is the backend's
(``Backend.health_nodes``, ``Backend.excluding``): no node setting is read or rewritten here.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract import records
from contract.codec import to_plain
from contract.health import RESULT_FILE, NodeProbeSpec, cost, ring_pairs
from contract.spec import Layout
from launcher.cluster.backends import backend_for
from launcher.plan.cell import Cell
from launcher.plan.clusterschema import ClusterConfig
from launcher.plan.schema import HealthMode
from launcher.report import health

NODES_PER_JOB = 128
TREND_PLOT = "trend.png"  # beside each probe's record, on its MLflow run, and in a health=auto sweep's report
TREND_PROBES = 12  # the probes the trend plot shows (the latest last)
# What one node's figures and one pair's timings take, and a job's start, measured on the Slurm
# test cluster (docs/health.md): the cost --plan states for nodes it has not probed.
NODE_S, PAIR_S, START_S = 4.0, 1.5, 12.0


@dataclass
class Asked:
    """What a probe is asked: which cluster and nodes, how many repeats, which margin."""

    cluster: ClusterConfig
    output_root: Path
    nodes: list[str] = field(default_factory=list)  # empty: the backend's (the partition's, or this host)
    whole_pool: bool = False  # a sweep's probe: its pool's nodes, not the node list a run was placed on
    emulated_nodes: int = 1  # the local cluster: nodes emulated on this machine
    repeats: int = 5
    margin: float = health.MARGIN
    tracking_uri: str | None = None
    nodes_per_job: int = NODES_PER_JOB
    dcgm: bool = True


@dataclass
class Probed:
    record: dict[str, Any]
    verdicts: health.Verdicts
    folder: Path
    ledger: Path
    run_id: str | None = None
    errors: list[str] = field(default_factory=list)


def cluster_key(cluster: ClusterConfig) -> str:
    """The cluster as the fabric record and the noise floor name it (``slurm:debug``, ``local:<host>``)."""
    return backend_for(cluster.name).noise_floor_key(cluster)


def nodes_of(asked: Asked) -> list[str]:
    """The nodes asked for, else the backend's for these settings (those they keep out left out)."""
    return asked.nodes or backend_for(asked.cluster.name).health_nodes(asked.cluster, asked.whole_pool)


def where(cluster: ClusterConfig) -> str:
    """The pool of nodes a probe covers, in its backend's words: ``partition gpu``, ``this machine``."""
    return cluster.pool_words()


def plan_cost(nodes: int, nodes_per_job: int, in_turn: bool) -> dict[str, Any]:
    """What a probe of ``nodes`` costs, from the per-node, per-pair and start-up times above."""
    c = cost(nodes, nodes_per_job, in_turn, NODE_S, PAIR_S, START_S)
    return {"nodes": c.nodes, "jobs": c.jobs, "pairs": c.pairs, "rounds": c.rounds,
            "measured_s": c.measured_s, "wall_s": c.wall_s * c.jobs, "in_turn": in_turn}


def run(asked: Asked) -> Probed:
    """Probe the nodes, judge them, append the ledger, log the MLflow run."""
    one_machine = asked.cluster.one_machine
    names = nodes_of(asked)
    if not names:
        raise RuntimeError(f"no node to probe: {where(asked.cluster)} has no node that takes jobs, or the nodes its "
                           f"settings name, less those they keep out, left none (Slurm: sinfo -N shows the nodes' "
                           f"states; cluster.nodelist, cluster.exclude)")
    folder = records.new_folder(asked.output_root / "health")  # probes started in the same second: -2, -3
    chunks = [names] if one_machine else [names[i:i + asked.nodes_per_job]
                                          for i in range(0, len(names), asked.nodes_per_job)]
    results, errors, jobs = [], [], []
    for i, chunk in enumerate(chunks):
        out = folder / f"job{i}"
        result, error, job = _one_job(asked, chunk, out)
        jobs.append(job)
        if result is None:
            errors.append(f"nodes {','.join(chunk)}: {error}")
        else:
            results.append(result)
    merged = _merge(results) if results else None
    if merged is None:
        raise RuntimeError("the health probe measured nothing: " + "; ".join(errors))
    verdicts = health.judge(merged, asked.margin)
    key = cluster_key(asked.cluster)
    record = health.record(key, merged, verdicts, {"nodes": names, "jobs": jobs, "repeats": asked.repeats,
                                                   "folder": str(folder), "errors": errors})
    ledger = health.ledger_path(asked.output_root, key)
    health.append(ledger, record)
    records.write_document(folder / "record.json", record)
    health.trend_plot(health.read(ledger)[-TREND_PROBES:], folder / TREND_PLOT)
    probed = Probed(record, verdicts, folder, ledger, errors=errors)
    if asked.tracking_uri:
        probed.run_id = log_run(asked.tracking_uri, key, record, folder)
    return probed


def _one_job(asked: Asked, chunk: list[str], out: Path) -> tuple[dict[str, Any] | None, str | None, str | None]:
    c = asked.cluster
    one_machine = c.one_machine
    n = asked.emulated_nodes if one_machine else len(chunk)
    # The sweep's cluster settings (its account, QOS, sbatch and srun options), on these nodes
    # (Backend.run_health places the job on them), whole.
    cluster = dataclasses.replace(c, exclusive=True, cpus_per_task=None, mem_gb=None)
    layout = Layout(nodes=1 if one_machine else n, tasks_per_node=n if one_machine else 1,
                    gpus_per_node=c.gpus_per_node, cpus_per_task=1)
    spec = NodeProbeSpec(out_dir=str(out), nodes=n, cpus_per_task=0, gpus_per_node=c.gpus_per_node,
                         repeats=asked.repeats, emulate_nodes=one_machine, dcgm=asked.dcgm)
    out.mkdir(parents=True, exist_ok=True)
    records.write_document(out / "asked.json", to_plain(spec))
    job, error = backend_for(c.name).run_health(out / "submitit", cluster, layout, spec, chunk)
    result = records.maybe_document(out / RESULT_FILE, "a node probe's result")
    return result, error if result is not None else error or "it left no result", job


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several jobs' results as one probe: nodes in order, each job's pairs renumbered."""
    nodes, pairs, offset = [], [], 0
    for r in results:
        nodes += r["nodes"]
        pairs += [{**p, "pair": [p["pair"][0] + offset, p["pair"][1] + offset]} for p in r["pairs"]]
        offset += len(r["nodes"])
    first = results[0]
    return {**first, "nodes": nodes, "pairs": pairs, "node_s": sum(r["node_s"] for r in results),
            "pairs_s": sum(r["pairs_s"] for r in results), "job_s": sum(r["job_s"] for r in results)}


def log_run(uri: str, key: str, record: dict[str, Any], folder: Path) -> str:
    """One MLflow run per probe in the cluster's health experiment: each node's figures as metrics
    (``<node>/<figure>``), each pair's (``pair/<a>-<b>/busbw_gb_per_s``), the verdicts as tags."""
    from mlflow.entities import Metric

    from launcher.track.tracking import SweepTracker, attach

    tracker = SweepTracker(uri, f"health-{key}")
    now_ms = int(time.time() * 1000)
    verdicts = record["verdicts"]
    run = tracker.client.create_run(tracker.experiment_id, run_name=f"health {record['measured_at']}",
                                    tags={"health_flagged": ",".join(verdicts["flagged"]) or "none",
                                          "health_judged": str(verdicts["judged"]), "cluster": key})
    metrics = [Metric(f"{node}/{figure}", value, now_ms, 0) for node, n in record["nodes"].items()
               for figure, value in n["figures"].items() if value]
    metrics += [Metric(f"pair/{pair}/busbw_gb_per_s", value, now_ms, 0) for pair, value in record["pairs"].items()
                if value]
    metrics += [Metric("health_flagged_nodes", float(len(verdicts["flagged"])), now_ms, 0)]
    for i in range(0, len(metrics), 900):  # MLflow takes at most 1000 metrics per batch
        tracker.client.log_batch(run.info.run_id, metrics=metrics[i:i + 900])
    attach(uri, run.info.run_id, [p for p in (folder / "record.json", folder / TREND_PLOT) if p.exists()])
    tracker.client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def said(probed: Probed) -> list[str]:
    """What the command prints: the cost, the verdicts with their false-alarm rate, what to do."""
    r, v = probed.record, probed.verdicts
    nodes = len(r["nodes"])
    pairs = len(r["pairs"])
    lines = [f"health probe of {nodes} node(s), {pairs} pair(s) (a ring: {len(ring_pairs(nodes))} for {nodes} "
             f"nodes), {len(r['asked']['jobs'])} job(s) ({', '.join(str(j) for j in r['asked']['jobs'])}); "
             f"{r['cost']['node_s']:.1f} s of node figures and {r['cost']['pairs_s']:.1f} s of pairs in "
             f"{r['cost']['job_s']:.1f} s of job" + (" (the nodes share one machine: measured in turn)"
                                                      if r["cost"]["in_turn"] else "")]
    lines += [f"  {e}" for e in probed.errors]
    if not v.judged:
        lines.append(f"no verdict: {v.note}")
    else:
        lines.append(f"verdicts: {health.false_alarm_text(v)}" + (f"; {v.note}" if v.note else ""))
    for node in r["nodes"]:
        mine = r["nodes"][node]
        figs = ", ".join(f"{f} {x:.3g}" for f, x in mine["figures"].items() if x)
        dcgm = mine["dcgm"].get("verdict")
        flag = ("SLOW: " + "; ".join(v.slow_nodes.get(node, []) or [v.dcgm_failed.get(node, "its network")])
                if node in v.flagged else "ok")
        lines.append(f"  {node}: {figs}; dcgm {dcgm}" + (f" ({mine['dcgm'].get('reason')})" if dcgm != "pass" else "")
                     + f": {flag}")
    for pair, why in v.slow_links.items():
        lines.append(f"  pair {pair}: {why}")
    if v.judged and not v.flagged and not v.slow_links:
        lines.append("  nothing flagged")
    lines.append(f"ledger: {probed.ledger}" + (f"; MLflow run {probed.run_id}" if probed.run_id else ""))
    for line in health.drain_lines(v):
        lines.append(f"  to drain it (not run): {line}")
    return lines



# ---- health=auto: before a sweep's cells ---------------------------------------------------------

def before_cells(cells: list[Cell]) -> dict[str, Any] | None:
    """``health=auto|always``: judge the nodes of the cells' pools (Slurm: partitions), keep the flagged
    ones out of every cell (``Backend.excluding``: Slurm's cluster.exclude, beside the user's own), and
    say so. ``auto`` takes the ledger's latest probe when it is younger than REUSE_WITHIN_MIN and covers
    the pool's nodes, else probes; ``always`` probes. A node flagged by the probe before and clean in
    this one comes back. A placement (a run's node list) on a flagged node is dropped: the scheduler
    places that run elsewhere. Returns what the sweep's report says (None: health=off): each probe's
    pool and its backend's words for it (``where``), never a backend's key."""
    cfg = cells[0].config
    if cfg.health is HealthMode.off:
        return None
    notes: dict[str, Any] = {"probes": []}
    backend = backend_for(cells[0].cluster.name)
    for pool in dict.fromkeys(c.cluster.pool() for c in cells):
        first = next(c for c in cells if c.cluster.pool() == pool)
        root = Path(cfg.output_root)
        asked = Asked(first.cluster, root, whole_pool=True,
                      tracking_uri=(cfg.tracking.uri or f"sqlite:///{(root / 'mlflow.db').resolve()}")
                      if cfg.tracking.enabled else None)
        ledger = health.ledger_path(root, cluster_key(asked.cluster))
        records = health.read(ledger)
        latest = records[-1] if records and cfg.health is HealthMode.auto and _fresh(records[-1], nodes_of(asked)) else None
        here = where(first.cluster)
        if latest is not None:
            print(f"health=auto: the nodes of {here} as the probe of {latest['measured_at']} judged them "
                  f"(younger than {REUSE_WITHIN_MIN} min; health=always probes again)", flush=True)
            previous, run_id = (records[-2] if len(records) > 1 else None), None
        else:
            print(f"health={cfg.health.value}: probing the nodes of {here} before the cells", flush=True)
            try:
                probed = run(asked)
            except RuntimeError as exc:  # no figures: the sweep runs on every node, and says why
                notes["probes"].append({"pool": pool, "where": here, "error": str(exc), "excluded": [], "back": []})
                print(f"health: {exc}; no node excluded", flush=True)
                continue
            print("\n".join(said(probed)), flush=True)
            latest, previous, run_id = probed.record, (records[-1] if records else None), probed.run_id
        verdicts = latest["verdicts"]
        flagged = list(verdicts["flagged"])
        back = sorted(set(previous["verdicts"]["flagged"]) - set(flagged)) if previous else []
        for cell in (c for c in cells if c.cluster.pool() == pool):
            backend.excluding(cell, flagged)  # a run placed on a flagged node is placed elsewhere
        notes["probes"].append({"pool": pool, "where": here, "excluded": flagged, "back": back,
                                "why": {n: verdicts["slow_nodes"].get(n) or [verdicts["dcgm_failed"].get(n)
                                                                              or "its network is slow"]
                                        for n in flagged},
                                "measured_at": latest["measured_at"], "ledger": str(ledger), "run_id": run_id,
                                "trend": str(Path(latest["asked"]["folder"]) / TREND_PLOT),
                                "judged": verdicts["judged"], "note": verdicts["note"]})
        print(f"health: {'excluded ' + ', '.join(flagged) if flagged else 'no node excluded'}"
              + (f"; back after a clean probe: {', '.join(back)}" if back else ""), flush=True)
    return notes


REUSE_WITHIN_MIN = 30  # health=auto: a probe this recent stands for the nodes (a scrontab keeps one fresh)


def _fresh(record: dict[str, Any], nodes: list[str]) -> bool:
    """Whether a ledger record is recent enough and covers ``nodes``."""
    from datetime import datetime

    try:
        age_s = (datetime.now() - datetime.fromisoformat(record["measured_at"])).total_seconds()
    except (KeyError, ValueError):
        return False
    return 0 <= age_s <= REUSE_WITHIN_MIN * 60 and set(nodes) <= set(record.get("nodes", {}))
