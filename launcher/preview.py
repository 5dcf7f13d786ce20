"""``python -m launcher --plan [-m] ...``: what a sweep would submit, composed and checked like a real
run, printed without submitting anything or creating any file or MLflow run."""

from __future__ import annotations

from pathlib import Path

from contract.metrics import COLLECTIVE_KINDS
from launcher.cluster.backends import backend_for
from launcher.plan import fit, traffic
from launcher.plan.cell import Cell


def render(cells: list[Cell], predicted: dict[int, fit.StateBytes], max_array_size: int | None = None) -> str:
    """Cells with resources and predicted per-rank model state, then the sbatch calls with their scripts."""
    from launcher.forecast.cells import beside_plan
    from launcher.forecast.cellsearch import plan_lines

    return "\n".join([*_cells(cells, predicted), "", *_traffic(cells, predicted), "", *beside_plan(cells, predicted),
                      "", *plan_lines(cells, predicted), *_submissions(cells, max_array_size)])


def _cells(cells: list[Cell], predicted: dict[int, fit.StateBytes]) -> list[str]:
    lines = [f"{len(cells)} cell(s):", ""]
    if cells[0].cluster.declared:
        lines += ["Declared nodes (cluster.declared=true): checked against the settings alone, no cluster was "
                  "asked; this grid can be planned, not submitted.", ""]
    lines += ["| # | cell | nodes x ranks | GPUs/node | CPUs/rank | time min | model params | params/rank | "
              "grads/rank | optimizer/rank | state/rank | activations/rank (est.) | peak/rank (est.) | GPU mem | fits |",
              "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for cell in cells:
        c, lay, state = cell.cluster, cell.layout, predicted.get(cell.index)
        figures = ([f"{state.param_count:,}", fit.human(state.params), fit.human(state.grads),
                    fit.human(state.optimizer), fit.human(state.total),
                    fit.human(state.activations) if state.activations is not None else "-", fit.human(state.peak)]
                   if state else ["-"] * 7)
        gpu_mem = f"{c.gpu_mem_gib:g} GiB" if c.gpu_mem_gib and lay.gpus_per_node else "-"
        lines.append(f"| {cell.index} | {cell.name} | {lay.nodes} x {lay.tasks_per_node} | {lay.gpus_per_node} | "
                     f"{lay.cpus_per_task} | {c.timeout_min} | " + " | ".join(figures) + f" | {gpu_mem} | "
                     f"{_fit_verdict(cell, state)} |")
    refused = [cell for cell in cells if cell.fits(predicted.get(cell.index)) is False
               and not cell.config.allow_oom]
    if refused:
        lines += ["", f"{len(refused)} cell(s) do not fit their GPU's memory ({', '.join(c.name for c in refused)}): "
                      f"a run of this grid refuses them. Fix: {fit.DOES_NOT_FIT_FIX}"]
    asked = [cell for cell in cells if cell.time_asked]
    if asked:  # cluster.timeout_min=auto
        lines += ["", "time limits (cluster.timeout_min=auto): "
                  + "; ".join(f"{cell.index}: {cell.cluster.timeout_min} min, {cell.time_asked}" for cell in asked)]
    unchecked = [cell.name for cell in cells if cell.layout.gpus_per_node and not cell.cluster.gpu_mem_gib]
    if unchecked:
        lines += ["", f"fit not checked for {len(unchecked)} GPU cell(s): their GPU memory is unknown. Set "
                      "cluster.gpu_mem_gib, or cluster.gpu_type to a known GPU model (e.g. h100)."]
    return lines


def _fit_verdict(cell: Cell, state: fit.StateBytes | None) -> str:
    """"fits", "does not fit", or why it is not judged, for the plan's table."""
    verdict = cell.fits(state)
    if verdict is None:
        return ("host memory (offloaded)" if cell.config.strategy.cpu_offload and cell.layout.gpus_per_node
                else "-" if not cell.layout.gpus_per_node else "not judged (GPU memory unknown)")
    if verdict:
        return "fits"
    return "does not fit (allow_oom=true: runs anyway)" if cell.config.allow_oom else "does not fit"


def _traffic(cells: list[Cell], predicted: dict[int, fit.StateBytes]) -> list[str]:
    """Bytes per optimizer step by collective kind that each cell's strategy implies (the theory the
    report holds the measured bytes against)."""
    kinds = [k for k in COLLECTIVE_KINDS if any(k in s.comm_bytes_per_step for s in predicted.values())]
    if not kinds:
        return ["Communication per step (theory): none (every cell runs on one rank)."]
    lines = ["Communication per optimizer step (theory, launcher/plan/traffic.py; the report compares the "
             "measured bytes with it):", "",
             "| # | cell | " + " | ".join(k.replace("_", "-") for k in kinds) + " | total |",
             "|---:|---|" + "---:|" * (len(kinds) + 1)]
    for cell in cells:
        state = predicted.get(cell.index)
        if state is None:
            continue
        moved = state.comm_bytes_per_step
        figures = [traffic.human_bytes(moved[k]) if k in moved else "-" for k in kinds]
        lines.append(f"| {cell.index} | {cell.name} | " + " | ".join(figures)
                     + f" | {traffic.human_bytes(sum(moved.values()))} |")
    return lines


def _submissions(cells: list[Cell], max_array_size: int | None) -> list[str]:
    folder = Path(cells[0].config.output_root).resolve() / "<sweep>" / "submitit"
    backend = backend_for(cells[0].cluster.name)
    return backend.describe_submission(cells, folder, max_array_size)
