"""Whole sweeps through the real launcher, submitit's LocalExecutor, gloo and a SQLite MLflow store."""

import json
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from contract import metrics
from launcher.__main__ import main
from launcher.state import SweepState
from tests.stores import existing_store

pytestmark = pytest.mark.slow


def run_sweep(tmp_path, *overrides, fresh_store=False):
    """The sweep in ``tmp_path``, logging to the store there: one that exists (tests/stores.py) unless
    ``fresh_store``, when the launcher creates it."""
    if not fresh_store:
        existing_store(tmp_path)
    code = main(["-m", *overrides, f"output_root={tmp_path}", f"sweep_dir={tmp_path / 'sweep'}"])
    return code, SweepState.load(tmp_path / "sweep")


def test_ddp_and_fsdp_two_ranks_parity_and_mlflow(tmp_path, fast_overrides, capsys):
    code, state = run_sweep(tmp_path, "strategy=ddp,fsdp", "cluster.tasks_per_node=2", *fast_overrides,
                            "fabric.probe=auto", fresh_store=True)
    out = capsys.readouterr().out
    assert code == 0, out
    check_fabric_probe(state, out)
    assert [c.status for c in state.cells] == ["done", "done"]
    results = [json.loads((state.cell_dir(c) / "result.json").read_text()) for c in state.cells]
    ddp, fsdp = (r["summary"] for r in results)
    # Same seed, same data, same initial weights: the first-step loss is the same under DDP and FSDP.
    assert ddp["loss_first"] == pytest.approx(fsdp["loss_first"], rel=1e-5)
    assert results[0]["losses"][:3] == pytest.approx(results[1]["losses"][:3], rel=1e-4)
    for s in (ddp, fsdp):
        assert s["world_size"] == 2 and s["measured_steps"] == 4
        assert s["throughput_samples_per_s"] > 0 and s["step_time_ms_p50"] > 0 and s["peak_rss_gib"] > 0
    # The worker counts its model's FLOPs per sample and records them: the forecasts read them from here.
    assert ddp["flops_per_sample"] == fsdp["flops_per_sample"] > 0
    # FSDP holds half the parameter bytes per rank that DDP holds (2 ranks, full shard).
    assert fsdp["param_bytes"] == pytest.approx(ddp["param_bytes"] / 2, rel=0.02)
    # Both ranks joined one rendezvous on one port; rank 0 saw both hostnames.
    assert all(r["tags"]["world_size"] == "2" for r in results)

    # The comparison table: one row per cell.
    assert "strategy=ddp" in out and "strategy=fsdp" in out and "samples/s" in out

    client = MlflowClient(tracking_uri=state.tracking_uri)
    runs = client.search_runs([state.experiment_id])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == state.parent_run_id]
    assert len(runs) == 3 and len(children) == 2  # one parent + one child per cell, none per rank
    for run in children:
        assert run.info.status == "FINISHED"
        assert run.data.tags["strategy"] in ("ddp", "fsdp") and run.data.tags["nodes"] == "1"
        assert run.data.params["batch_size"] == "4" and run.data.params["model.name"] == "gpt_tiny"
        assert run.data.metrics["throughput_samples_per_s"] > 0
        history = client.get_metric_history(run.info.run_id, "loss")
        assert sorted(m.step for m in history) == list(range(6))
    # JSONL holds the same steps.
    lines = [json.loads(x) for x in (state.cell_dir(state.cells[0]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["kind"] == "step"] == list(range(6))
    assert Path(state.sweep_dir, "report.md").exists()
    # The answer where a teammate looks first: atop the parent's page, and a tag per question.
    parent = client.get_run(state.parent_run_id).data.tags
    verdict = parent["verdict.2 ranks"]
    assert verdict.startswith("fsdp against ddp") and verdict in parent["mlflow.note.content"]
    assert "## The answer" in parent["mlflow.note.content"]
    check_run_times(client, state)


def check_fabric_probe(state, out):
    """The shape's fabric probe ran before the first cell; its figures are in report.md, on the parent
    run (registered metrics, step = the shape's ranks, its files) and kept beside the sweep."""
    assert out.index("fabric 1x2: probing") < out.index("[1/2]")
    assert "| intra_node | all_reduce | 2 |" in Path(state.sweep_dir, "report.md").read_text()
    client = MlflowClient(tracking_uri=state.tracking_uri)
    figures = {k: v for k, v in client.get_run(state.parent_run_id).data.metrics.items() if k.startswith("fabric_")}
    assert figures["fabric_all_reduce_intra_node_latency_us"] >= 0 and figures["fabric_job_s"] > figures["fabric_probe_s"]
    assert all(metrics.get(k).source is metrics.Source.FABRIC for k in figures)
    assert [m.step for m in client.get_metric_history(state.parent_run_id, "fabric_probe_s")] == [2]
    assert {a.path for a in client.list_artifacts(state.parent_run_id, "fabric/1x2")} == {
        "fabric/1x2/fabric.json", "fabric/1x2/probe.json"}
    kept = json.loads(Path(state.sweep_dir).parent.joinpath("fabrics.json").read_text())
    assert [k.split()[1] for k in kept] == ["1x2"] and kept[next(iter(kept))]["sweep"] == state.name


def check_run_times(client, state):
    """Every cell's run spans its job, not the sweep's bookkeeping: it starts after the launcher
    started the job's process and before its steps; it ends after its summary (written after the
    last step) and before submitit wrote the job's result. Local cells run one after another, so their runs do not
    overlap; the parent starts with the first job and ends where the last job ended."""
    spans = []
    for cell in state.cells:
        run = client.get_run(cell.run_id).info
        records = [json.loads(x) for x in (state.cell_dir(cell) / "metrics.jsonl").read_text().splitlines()]
        # MLflow keeps whole milliseconds: every bound below is one too.
        summary_ms = int(1000 * next(r["time"] for r in records if r["kind"] == "summary"))  # after the last step
        steps_ms = int(sum(r["step_time_ms"] for r in records if r["kind"] == "step"))
        result_pkl = next(Path(state.sweep_dir, "submitit").glob(f"{cell.job_id}_0_result.pkl"))
        assert int(1000 * cell.submitted_at) <= run.start_time <= summary_ms - steps_ms, (cell.name, run.start_time)
        assert summary_ms <= run.end_time <= int(1000 * result_pkl.stat().st_mtime), (cell.name, run.end_time)
        spans.append((run.start_time, run.end_time))
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)), spans
    parent = client.get_run(state.parent_run_id).info
    assert parent.start_time <= spans[0][0] and parent.end_time == max(end for _, end in spans), (parent, spans)


def test_emulated_nodes_get_node_ranks_and_the_cells_setup_and_memory_limit(tmp_path, fast_overrides):
    """Two emulated nodes; the cell's setup line runs before its ranks, and a memory limit that the
    cell fits in (where this machine allows memory cgroups) lets it finish and is removed after."""
    from launcher.cluster.local import memlimit

    marker = tmp_path / "setup-ran"
    limit = [] if memlimit.problem() else ["cluster.mem_gb=4"]
    code, state = run_sweep(tmp_path, "nodes=2", "cluster.tasks_per_node=1", "strategy=fsdp_noshard", "tracking=off",
                            f"cluster.setup=[touch {marker}]", *limit, *fast_overrides)
    assert code == 0 and marker.exists()
    result = json.loads((state.cell_dir(state.cells[0]) / "result.json").read_text())
    assert result["summary"]["nodes"] == 2 and result["summary"]["world_size"] == 2
    if limit:
        assert state.cells[0].cluster.mem_gb == 4
        parent = memlimit.own_cgroup()
        assert parent is not None and not list(parent[0].glob(f"{memlimit.PREFIX}*"))


def test_failing_cell_is_recorded_and_marked_failed(tmp_path, fast_overrides):
    # A model that passes every check before launch (its forward's shapes fit the data on fake tensors,
    # which carry no values) but reads past its table on real token ids: every rank fails at its
    # first step.
    code, state = run_sweep(tmp_path, "model=custom", "model._target_=torch.nn.Embedding", "model.input=tokens",
                            "model.params.num_embeddings=10", "model.params.embedding_dim=256",
                            "cluster.tasks_per_node=2", *fast_overrides)
    assert code == 1
    cell = state.cells[0]
    assert cell.status == "failed" and re.match(r"rank [01] on \S+ failed: IndexError", cell.error), cell.error
    run = MlflowClient(tracking_uri=state.tracking_uri).get_run(cell.run_id)
    assert run.info.status == "FAILED" and "index out of range" in run.data.tags["error"]


def test_a_model_that_cannot_build_is_refused_before_anything_exists(tmp_path, fast_overrides, capsys):
    # A model.params key the model does not take: refused on the login node, no directory, no run.
    code = main(["+model.params.bogus=1", f"output_root={tmp_path / 'out'}", *fast_overrides])
    assert code == 2
    assert "does not take params ['bogus']" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_rerunning_a_sweep_resumes_it_without_rerunning_finished_cells(tmp_path, fast_overrides):
    code, state = run_sweep(tmp_path, "strategy=ddp,fsdp", *fast_overrides)
    assert code == 0
    # As if the sweep had been interrupted during its second cell.
    second = state.cells[1]
    (state.cell_dir(second) / "result.json").unlink()
    second.status = "failed"
    state.save()
    done_job = state.cells[0].job_id
    code, resumed = run_sweep(tmp_path, "strategy=ddp,fsdp", *fast_overrides)
    assert code == 0
    assert resumed.cells[0].job_id == done_job  # not run again
    assert resumed.cells[1].job_id != second.job_id and resumed.cells[1].status == "done"
    assert (resumed.cell_dir(resumed.cells[1]) / "result.json").exists()
    runs = MlflowClient(tracking_uri=resumed.tracking_uri).search_runs([resumed.experiment_id])
    assert len(runs) == 3  # the same parent and child runs, none added
    # Another grid on the same directory is refused.
    code = main(["-m", "strategy=ddp,fsdp,zero2", *fast_overrides, f"output_root={tmp_path}",
                 f"sweep_dir={tmp_path / 'sweep'}"])
    assert code == 2


def test_a_flagged_cell_is_rerun_alone_into_a_new_run_and_keeps_its_first_attempt(tmp_path, fast_overrides):
    from launcher.commands import status
    from launcher.plan.cell import CellStatus

    code, state = run_sweep(tmp_path, *fast_overrides)
    assert code == 0
    cell = state.cells[0]
    first_run, first_job = cell.run_id, cell.job_id
    # As launcher/cluster/colocation.py records it when another job shared the cell's cores.
    cell.interference = "other processes used 40% of its cores during the measured window"
    state.save()
    again = status.resubmit_flagged(SweepState.load(state.sweep_dir))
    assert [c.index for c in again] == [0]
    rerun = SweepState.load(state.sweep_dir).cells[0]
    assert rerun.status is CellStatus.done and rerun.job_id != first_job and rerun.resubmits == 1
    assert rerun.run_id and rerun.run_id != first_run and rerun.interference is None
    cell_dir = state.cell_dir(rerun)
    assert (cell_dir / "attempt-1" / "result.json").exists() and (cell_dir / "result.json").exists()
    client = MlflowClient(tracking_uri=state.tracking_uri)
    assert client.get_run(rerun.run_id).info.status == "FINISHED"
    assert client.get_run(first_run).info.status == "FINISHED"  # the first attempt's numbers stay
