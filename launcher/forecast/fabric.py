"""A cluster's fabric as the fabric probe measured it (jobs/fabric.py): kept between sweeps, shown in
each sweep's report, logged on its parent run.

A sweep directory holds one folder per shape it probed or reused, ``fabric/<shape>/`` (written by
launcher/probe.py before the cells): ``probe.json`` (what was asked, the job, where the figures
come from) and ``fabric.json`` (the figures: the probe's result, or a copy of the kept record).
The kept records live in ``fabrics.json`` beside the sweep directories (the output root), like the
noise floor (launcher/report/noisefloor.py): one per cluster and shape, with the nodes and the
software it was measured on. A record whose nodes or software differ from a sweep's is measured
again; ``fabric.probe=always`` measures again anyway.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from contract import metrics, records
from contract.fabric import RESULT_FILE
from contract.spec import Layout
from launcher.forecast import perfmodel
from launcher.plan.clusterschema import ClusterConfig
from launcher.report.rows import md_cell

PROBE_DIR = "fabric"
PROBE_FILE = "probe.json"
KEPT_FILE = "fabrics.json"


@dataclass
class Probed:
    """One shape of a sweep: what was asked (probe.json) and the figures, where there are any."""

    folder: Path
    asked: dict[str, Any]
    result: dict[str, Any] | None

    @property
    def source(self) -> str:
        kept = self.asked.get("kept_from")
        if kept:
            return f"kept from sweep {kept.get('sweep')} ({str(kept.get('measured_at', '?'))[:10]})"
        job = self.asked.get("job_id")
        if self.result is None:
            return f"probe job {job or '-'} left no result: {self.asked.get('error') or 'it failed or has not ended'}"
        return f"measured by this sweep (job {job})"


def shape_name(layout: Layout) -> str:
    """``2x1`` (nodes x ranks per node), ``2x8x8gpu`` on GPUs: a probe folder's and a record's name."""
    return f"{layout.nodes}x{layout.tasks_per_node}" + (f"x{layout.gpus_per_node}gpu" if layout.gpus_per_node else "")


def software(cluster: ClusterConfig) -> dict[str, Any]:
    """What the ranks run that decides their collectives: torch, the interpreter, the container, setup."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {"torch": torch_version, "python": cluster.python or sys.executable,
            "container": cluster.software(),
            "setup": list(cluster.setup)}


def identity(cluster_key: str, layout: Layout, nodes: str, cluster: ClusterConfig) -> dict[str, Any]:
    """What a kept record must match to stand for a sweep's shape."""
    return {"cluster": cluster_key, "shape": shape_name(layout), "nodes": nodes, "software": software(cluster)}


def kept(root: Path, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The record kept for ``wanted``'s cluster and shape when its nodes and software are the same."""
    record = _read(root).get(_key(wanted))
    if isinstance(record, dict) and record.get("identity") == wanted and isinstance(record.get("result"), dict):
        return record
    return None


def keep(root: Path, probed: Probed, sweep: str) -> None:
    """Keep a probe this sweep measured as its cluster's and shape's record (the newest wins)."""
    if probed.result is None or probed.asked.get("kept_from"):
        return
    wanted = probed.asked["identity"]
    result = probed.result
    if (_read(root).get(_key(wanted)) or {}).get("result", {}).get("measured_at") == result.get("measured_at"):
        return  # kept already (the local sweep keeps it at once; its report comes here again)

    def kept(records: dict[str, Any]) -> dict[str, Any]:
        records[_key(wanted)] = {"identity": wanted, "sweep": sweep, "measured_at": result.get("measured_at"),
                                 "result": result}
        return records

    # Under the record's lock, atomic, a damaged entry set aside (contract/records.py); a read-only
    # output root keeps its old records: this sweep's figures are in its own folder.
    records.update_keyed(Path(root) / KEPT_FILE, kept, _entry)


def _key(wanted: dict[str, Any]) -> str:
    return f"{wanted['cluster']} {wanted['shape']}"


def _read(root: Path) -> dict[str, Any]:
    # None kept yet, or a damaged file (set aside and named): every shape is probed again.
    return records.read_keyed(Path(root) / KEPT_FILE, _entry)


def _entry(entry: Any) -> str | None:
    """Why an entry of fabrics.json is not a shape's kept probe (None: it is one)."""
    return records.lacks(entry, {"identity": dict, "result": dict})


# ---- a sweep's folders ----------------------------------------------------------------------------

def write_asked(folder: Path, asked: dict[str, Any], result: dict[str, Any] | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    records.write_document(folder / PROBE_FILE, asked)
    if result is not None:
        records.write_document(folder / RESULT_FILE, result)


def read_sweep(sweep_dir: Path) -> list[Probed]:
    """Every shape the sweep probed or reused, in shape order."""
    out = []
    for asked_file in sorted(Path(sweep_dir).glob(f"{PROBE_DIR}/*/{PROBE_FILE}")):
        asked = _json(asked_file)
        if asked is not None:
            out.append(Probed(asked_file.parent, asked, _json(asked_file.parent / RESULT_FILE)))
    return out


def _json(path: Path) -> dict[str, Any] | None:
    return records.maybe_document(path, "a fabric probe's record")


# ---- the report's section and the parent run's figures --------------------------------------------

def section(probed: list[Probed]) -> list[str]:
    """``## Fabric``: per shape the fitted latency and bandwidth of each collective and scope, the
    cores a rank had, what distorts the figures, and nccl-tests' table of every message size."""
    if not probed:
        return []
    parts = ["## Fabric", "",
             "How fast this sweep's ranks move bytes, measured by a probe job of each shape before the cells "
             "(docs/fabric.md). As nccl-tests report it: algbw = bytes / time and busbw = algbw x 2(n-1)/n "
             "(all_reduce) or x (n-1)/n (all_gather, reduce_scatter), with GB = 1e9 bytes; alpha and beta are "
             "the least-squares fit of time = alpha + bytes x factor / beta over the message sizes, and the fit "
             "error is its root mean square relative error.", ""]
    for one in probed:
        parts += _shape_part(one)
    return parts


def _shape_part(one: Probed) -> list[str]:
    result = one.result
    title = f"### {one.asked['identity']['shape']}"
    if result is None:
        return [title, "", f"No figures: {md_cell(one.source)}.", ""]
    parts = [f"{title} ({result.get('backend')}, {result.get('device')}, torch {result.get('torch')}"
             + (f", NCCL {result['nccl']}" if result.get("nccl") else "") + ")", "",
             f"{md_cell(one.source)}; cost: {result.get('probe_s', 0):.1f} s of collectives in a "
             f"{result.get('job_s', 0):.1f} s job ({result.get('iters')} iterations after {result.get('warmup_iters')} "
             f"per size).", "",
             "| scope | collective | ranks | alpha us | beta GB/s (busbw) | best busbw GB/s | fit error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for f in result.get("fits", []):
        beta = f.get("bandwidth_gb_per_s")
        parts.append(f"| {f['scope']} | {f['collective']} | {f['ranks']} | {f['latency_us']:.1f} | "
                     f"{'-' if beta is None else f'{beta:.3g}'} | {f['busbw_gb_per_s_peak']:.3g} | "
                     f"{f['fit_error']:.0%} |")
    return [*parts, "", _cores_line(result), "", *(f"⚠ {note}" for note in result.get("distortions", [])), "",
            *_sizes_table(result), ""]


def _cores_line(result: dict[str, Any]) -> str:
    machines = result.get("machines", {}).values()
    said = "; ".join(f"{', '.join(m['hosts'])}: {m['ranks']} rank(s) of {m['nodes']} node(s) on {m['cpus']:g} CPUs"
                     + (f", cgroup quota {m['cgroup_cpus']:g}" if m.get("cgroup_cpus") else ", no cgroup quota")
                     + f", {m['threads_per_rank']} thread(s) each" for m in machines)
    return f"Cores: {result.get('cores_per_rank', 0):.2g} per rank ({said})."


def _sizes_table(result: dict[str, Any]) -> list[str]:
    rows = ["<details><summary>Every message size (nccl-tests' columns)</summary>", "",
            "| scope | collective | ranks | size B | count | time us | algbw GB/s | busbw GB/s |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    rows += [f"| {p['scope']} | {p['collective']} | {p['ranks']} | {p['size_bytes']} | {p['count']} | "
             f"{p['time_us']:.1f} | {p['algbw_gb_per_s']:.3g} | {p['busbw_gb_per_s']:.3g} |"
             for p in result.get("points", [])]
    return [*rows, "", "</details>"]


def parent_figures(probed: list[Probed]) -> dict[int, dict[str, float]]:
    """{ranks of the shape: {registered fabric metric: value}}: the parent run's metrics, one step per
    shape (MLflow keeps a metric's values by step)."""
    out: dict[int, dict[str, float]] = {}
    for one in probed:
        if one.result is None:
            continue
        shape = one.result["shape"]
        figures = {metrics.fabric_name(f["collective"], f["scope"], figure): f[figure]
                   for f in one.result.get("fits", []) for figure, _, _ in metrics.FABRIC_FIGURES
                   if f.get(figure) is not None}
        figures.update(fabric_probe_s=one.result.get("probe_s"), fabric_job_s=one.result.get("job_s"),
                       fabric_cores_per_rank=one.result.get("cores_per_rank"))
        out[shape["nodes"] * shape["tasks_per_node"]] = {metrics.get(k).name: float(v) for k, v in figures.items()
                                                         if v is not None}
    return out


# ---- the performance model's links ----------------------------------------------------------------

_MODEL_SCOPE = {"intra_node": perfmodel.INTRA, "inter_node": perfmodel.INTER}


def model_fabric(probed: Sequence[Probed]) -> perfmodel.Fabric | None:
    """The probe's fitted latency and bandwidth per collective and scope as the performance model's
    links (alpha ms = latency us / 1000; bytes per ms = beta GB/s x 1e6; a beta the fit could not
    find, time not growing with size, moves bytes for free); None where no probe left figures.
    Larger shapes win where shapes overlap (closer to the scales forecast); a collective probed in
    one scope only stands for it in both (a single-node shape has no inter-node figures)."""
    measured = sorted((p for p in probed if p.result and p.result.get("fits")), key=_ranks)
    if not measured:
        return None
    links: dict[tuple[str, str], perfmodel.Link] = {}
    for one in measured:
        for f in (one.result or {})["fits"]:
            beta = f.get("bandwidth_gb_per_s")
            link = perfmodel.Link(f["latency_us"] / 1e3, beta * 1e6 if beta else math.inf)
            links[(f["collective"], _MODEL_SCOPE[f["scope"]])] = link
            links[(f["collective"], perfmodel.ANY)] = link
    shapes = ", ".join(str(one.asked["identity"]["shape"]) for one in measured)
    return perfmodel.Fabric(links, f"the fabric probe of shape {shapes} ({measured[-1].source})")


def _ranks(one: Probed) -> int:
    shape = (one.result or {}).get("shape") or {}
    return int(shape.get("nodes", 1)) * int(shape.get("tasks_per_node", 1))


def one_machine_cpus(probed: Sequence[Probed]) -> float | None:
    """The CPUs of the one machine that ran every rank of every probed multi-node shape (nodes
    emulated on one machine, as on the Slurm test cluster): then a rank has its share of that
    machine at any shape, measured or forecast. None where a shape spanned machines, or where no
    multi-node shape was probed (one node says nothing about how nodes map onto machines)."""
    results = [p.result for p in probed if p.result and p.result.get("machines")
               and int((p.result.get("shape") or {}).get("nodes", 1)) > 1]
    if not results or any(len(r["machines"]) != 1 for r in results):
        return None
    return min(min(m["cpus"], m.get("cgroup_cpus") or m["cpus"]) for r in results for m in r["machines"].values())
