"""bench/ cannot drift from the tool: each Slurm figure's two command lines are checked, nothing
timed. `python -m bench` once stopped at figure 4 because its grid gave the reference app a key
that only this tool has (`runs`): the app refused it ("Could not override 'runs'")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench import slurm_submit, thousand
from launcher.plan.grid import compose, expand
from launcher.plan.planner import plan

APP_CONFIG = Path(__file__).resolve().parent.parent / "bench" / "hsl_app" / "conf" / "config.yaml"


@pytest.mark.parametrize("figure", [slurm_submit, thousand], ids=["figure 4", "figure 6"])
def test_the_reference_app_has_every_key_of_its_grid(figure):
    app_keys = set(yaml.safe_load(APP_CONFIG.read_text())) - {"defaults", "hydra"}
    given = {override.split("=", 1)[0] for override in figure.GRID}
    assert given <= app_keys, f"the reference app has no {sorted(given - app_keys)}: move them to OURS_ONLY"


def test_our_side_of_figure_4_plans_its_cells():
    points, swept = expand([*slurm_submit.GRID, *slurm_submit.OURS_ONLY], True)
    assert len(plan(compose(points, swept))) == slurm_submit.CELLS


def test_our_side_of_figure_3_plans_its_cell(tmp_path):
    from bench import startup
    from bench.common import Settings

    overrides = startup.launcher_overrides(Settings(), tmp_path, tmp_path / "sweep")
    points, swept = expand(overrides, False)
    [cell] = plan(compose(points, swept))
    assert cell.resolved is not None and cell.resolved.model.seq_len == Settings().seq_len
    assert cell.layout.tasks_per_node == Settings().nproc


@pytest.mark.parametrize("script", ["bare_loop", "worker_entry", "paired_steps"])
def test_each_step_script_takes_the_arguments_figures_1_to_3_give_it(script):
    """Settings.train_args is what both sides of figures 1-3 get; each script's parser takes it, and
    our side's RunSpec is made (with its checks) for both strategies."""
    import importlib

    from bench.common import Settings

    module = importlib.import_module(f"bench.{script}")
    extra = {"bare_loop": ["--out", "x.json"], "worker_entry": ["--out-dir", "x"], "paired_steps": ["--out", "x"]}[script]
    train = Settings().train_args()
    if script == "paired_steps":  # blocks of steps instead of a step count
        train = [a for i, a in enumerate(train) if "--steps" not in train[max(0, i - 1):i + 1]]
    for strategy in ("ddp", "fsdp"):
        args = module.parser().parse_args(["--strategy", strategy, *extra, *train])
        if script == "worker_entry":
            spec = module.spec_for(args, world=2, local_world=2, gpus=False, cpus_per_task=1)
            assert spec.strategy.name.value == strategy and spec.train.batch_size == Settings().batch_size


def test_python_m_bench_runs_every_figure():
    """Every figure module of bench/ is in the suite `python -m bench` runs (figure 6 once was not)."""
    from bench import run

    figures = {p.stem for p in Path(run.__file__).parent.glob("*.py")
               if "def run(settings: Settings" in p.read_text()}
    assert figures == {m.__name__.rpartition(".")[2] for m in run.FIGURES.values()}
