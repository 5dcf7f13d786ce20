"""The fabric probe before a sweep's cells (jobs/fabric.py measures; launcher/forecast/fabric.py keeps).

For each shape of two or more ranks among the cells to run: the record kept for its cluster, nodes
and software, when there is one (``fabric.probe=auto``); otherwise a probe job of that shape,
submitted through the sweep's backend as a cell of that shape would be. A foreground backend runs
it to its end before the first cell; on Slurm the cells start after it (afterany). Either way no
cell's measured window holds it. ``fabric.probe=off`` probes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from contract.codec import to_plain
from contract.fabric import ProbeSpec, plan
from launcher.cluster.backends import backend_for
from launcher.cluster.base import Backend
from launcher.forecast import fabric
from launcher.plan.cell import Cell
from launcher.plan.schema import Config, FabricProbe
from launcher.state import SweepState


def before_cells(state: SweepState, todo: Sequence[Cell], cfg: Config) -> list[str]:
    """Reuse or probe each shape of ``todo`` (``cfg``: the sweep's settings); the ids of the probe jobs
    still running, which the cells must start after."""
    if cfg.fabric.probe is FabricProbe.off:
        return []
    backend = backend_for(state.cluster)
    running = []
    for cell in shapes(todo):
        folder = state.path / fabric.PROBE_DIR / folder_name(cell)
        if (folder / fabric.RESULT_FILE).exists():
            continue  # a resumed sweep: this shape has its figures
        job = _one_shape(state, backend, cell, cfg, folder)
        if job:
            running.append(job)
    return running


def shapes(cells: Sequence[Cell]) -> list[Cell]:
    """The first cell of each shape with collectives to time (two ranks or more)."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        if cell.world_size > 1:
            seen.setdefault(folder_name(cell), cell)
    return list(seen.values())


def folder_name(cell: Cell) -> str:
    """``2x1``, or ``2x8x8gpu-gpu`` where the cell names its pool of nodes (Slurm: its partition)."""
    pool = cell.cluster.pool()
    return fabric.shape_name(cell.layout) + (f"-{pool}" if pool else "")


def _one_shape(state: SweepState, backend: Backend, cell: Cell, cfg: Config, folder: Path) -> str | None:
    """The kept record, or a probe job; the job's id while it still runs (Slurm)."""
    c = cell.cluster
    wanted = fabric.identity(backend.noise_floor_key(c), cell.layout,
                             backend.nodes_fingerprint([cell]), c)
    record = fabric.kept(state.path.parent, wanted) if cfg.fabric.probe is FabricProbe.auto else None
    if record is not None:
        kept_from = {"sweep": record.get("sweep"), "measured_at": record.get("measured_at")}
        fabric.write_asked(folder, {"identity": wanted, "kept_from": kept_from}, record["result"])
        print(f"fabric {wanted['shape']}: kept from sweep {kept_from['sweep']} ({str(kept_from['measured_at'])[:10]}); "
              f"fabric.probe=always measures it again", flush=True)
        return None
    sizes, iters, warmup = plan(cell.layout.gpus_per_node > 0, cfg.fabric.full)
    spec = ProbeSpec(out_dir=str(folder), layout=cell.layout, sizes_bytes=sizes, iters=iters, warmup_iters=warmup,
                     emulate_nodes=c.one_machine, collective_timeout_s=cfg.collective_timeout_s)
    asked = {"identity": wanted, "spec": to_plain(spec)}
    fabric.write_asked(folder, asked)
    print(f"fabric {wanted['shape']}: probing {len(sizes)} sizes x 3 collectives, {iters} iterations each", flush=True)
    job, error = backend.start_probe(state, cell, spec)
    asked.update(job_id=job, error=error)
    fabric.write_asked(folder, asked)
    if not backend.runs_cells_in_foreground:
        return job
    probed = fabric.read_sweep(state.path)
    one = next((p for p in probed if p.folder == folder), None)
    if one is not None:
        fabric.keep(state.path.parent, one, state.name)
        print(f"    {said(one)}", flush=True)
    return None


def said(one: fabric.Probed) -> str:
    """One line: the cost, and all_reduce's fit in each scope."""
    if one.result is None:
        return one.source
    fits = "; ".join(f"{f['scope']} all_reduce alpha {f['latency_us']:.0f} us, beta "
                     + (f"{f['bandwidth_gb_per_s']:.3g} GB/s" if f["bandwidth_gb_per_s"] else "- (no size dependence)")
                     for f in one.result["fits"] if f["collective"] == "all_reduce")
    return f"{one.result['probe_s']:.1f} s of collectives in a {one.result['job_s']:.1f} s job: {fits}"
