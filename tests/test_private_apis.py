"""The private parts of Hydra and submitit the launcher relies on, each for a stated reason (see
where it is used): where a release moves or changes one, this fails and names it, instead of a
sweep failing at a user's desk. No cluster, no composition: each is called the way the launcher calls it."""

import inspect

import pytest

from contract.spec import Layout
from launcher.cluster.slurm.settings import SlurmSettings


def _moved(what: str, where: str, why: str) -> str:
    return (f"{what} moved or changed in this release; {where} uses it ({why}). Fix: use the release's "
            f"equivalent there, or the public way the comment at that place names.")


def test_hydras_override_step_applies_value_overrides_as_compose_does():
    import hydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    what = f"hydra._internal.config_loader_impl.ConfigLoaderImpl._apply_overrides_to_config (hydra-core {hydra.__version__})"
    why = "it applies a grid point's non-scalar overrides to a copied composition, ~3x faster than composing each point"
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        apply = ConfigLoaderImpl._apply_overrides_to_config
    except (ImportError, AttributeError):
        pytest.fail(_moved(what, "launcher/plan/grid.py:compose", why))
    assert list(inspect.signature(apply).parameters) == ["overrides", "cfg"], _moved(what, "launcher/plan/grid.py", why)
    cfg = OmegaConf.create({"cluster": {"srun_args": [], "additional_parameters": {}}, "seed": 0})
    parsed = OverridesParser.create().parse_overrides(
        ["cluster.srun_args=[--a,--b]", "+cluster.additional_parameters.hold=true", "seed=3"])
    apply(parsed, cfg)
    assert OmegaConf.to_container(cfg) == {"cluster": {"srun_args": ["--a", "--b"], "additional_parameters":
                                                       {"hold": True}}, "seed": 3}, _moved(what, "launcher/plan/grid.py", why)


def test_submitits_sbatch_renderer_renders_what_the_launcher_gives_it(tmp_path):
    import submitit

    from launcher.cluster.slurm.submit import slurm_executor, slurm_parameters

    what = (f"submitit.slurm.slurm._make_sbatch_string and SlurmExecutor._submitit_command_str (submitit "
            f"{submitit.__version__})")
    where = "launcher/cluster/slurm/submit.py:sbatch_script"
    why = "--plan shows the sbatch script submitit itself would write, without submitting"
    try:
        from submitit.slurm.slurm import _make_sbatch_string
    except ImportError:
        pytest.fail(_moved(what, where, why))
    cluster, layout = SlurmSettings(partition="debug", timeout_min=7), Layout(nodes=2, tasks_per_node=2)
    params = {**slurm_parameters(cluster, layout, "bench"), "map_count": 3}
    accepted = set(inspect.signature(_make_sbatch_string).parameters)
    assert {"command", "folder", *params} <= accepted, _moved(what, where, f"{why}; it no longer takes "
                                                              f"{sorted({'command', 'folder', *params} - accepted)}")
    executor = slurm_executor(tmp_path, cluster, layout, "bench")
    assert isinstance(getattr(executor, "_submitit_command_str", None), str), _moved(what, where, why)
    script = _make_sbatch_string(command=executor._submitit_command_str, folder=executor.folder,
                                 **{**executor.parameters, "map_count": 3})
    for line in ("#SBATCH --array=0-2", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --time=7",
                 "#SBATCH --partition=debug", "--kill-on-bad-exit=1"):
        assert line in script, _moved(what, where, f"{why}; the script has no {line!r}")
