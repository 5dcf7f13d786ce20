"""bench/ cannot drift from the tool: each Slurm figure's two command lines are checked, nothing
timed. `python -m bench` once stopped at figure 4 because its grid gave the reference app a key
that only this tool has (`runs`): the app refused it ("Could not override 'runs'")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench import slurm_submit, thousand
from launcher.plan.grid import compose, expand, plan

APP_CONFIG = Path(__file__).resolve().parent.parent / "bench" / "hsl_app" / "conf" / "config.yaml"


@pytest.mark.parametrize("figure", [slurm_submit, thousand], ids=["figure 4", "figure 6"])
def test_the_reference_app_has_every_key_of_its_grid(figure):
    app_keys = set(yaml.safe_load(APP_CONFIG.read_text())) - {"defaults", "hydra"}
    given = {override.split("=", 1)[0] for override in figure.GRID}
    assert given <= app_keys, f"the reference app has no {sorted(given - app_keys)}: move them to OURS_ONLY"


def test_our_side_of_figure_4_plans_its_cells():
    points, swept = expand([*slurm_submit.GRID, *slurm_submit.OURS_ONLY], True)
    assert len(plan(compose(points, swept))) == slurm_submit.CELLS
