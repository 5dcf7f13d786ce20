"""Values that end up in a shell, an sbatch script, a command line or a file name: one rule, checked
before submission.

submitit writes ``#SBATCH --key=value`` lines, joins ``srun_args`` into the srun command line and
pastes ``setup`` lines into the script; the sweep directory is written into the script's
``#SBATCH --output`` line. A newline in any of them would start a new script line (a new command
or a new #SBATCH directive); shell syntax in a value that is meant to be plain (a partition name)
would run. So every such setting is listed in :data:`SHELL_BOUND` with its kind, and
:func:`check_config` puts each through the one check, :func:`check`:

* ``plain``: Slurm names and lists, letters, digits and ``. , : = @ % / + - _ [ ]`` only;
* ``word``: one shell word (srun and container arguments; ``#`` too, never first: Pyxis images);
* ``line``: one line without control characters; shell by design (``module load cuda``), the
  user's own command, but it may not smuggle in extra lines;
* ``path``: a path written into the script or used as a directory: one line without control
  characters;
* ``name``: one file name component (a report directory named after an experiment): no ``/``,
  not ``.`` or ``..``, no control characters.

Every string-valued setting of the schema is either in :data:`SHELL_BOUND` or in
:data:`NOT_SHELL_BOUND` with the reason; tests/test_refusals.py walks the schema so that a new
setting cannot be added without saying which.
"""

from __future__ import annotations

import re
from typing import Any

from contract.spec import ConfigError

# Slurm names and lists: letters, digits and . , : = @ % / + - _ [ ] (node lists, gres, times).
PLAIN = re.compile(r"^[\w.,:=@%/+\-\[\]]*$")
# srun / container arguments: one word each; '#' too (Pyxis images: nvcr.io#nvidia/pytorch), which
# starts a shell comment only at the beginning of a word, and ARG never lets a word start with it.
ARG = re.compile(r"^[\w.,:=@%/+\-\[\]][\w.,:=@%/+\-\[\]#]*$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_WHY = {
    "plain": "may hold letters, digits and . , : = @ % / + - _ [ ] only (it is written into the sbatch script, where "
             "anything else is shell syntax).",
    "word": "each entry must be one shell word without quotes, spaces or shell syntax.",
    "line": "must be a single line (a newline or control character would add hidden lines to the job script).",
    "path": "must be one line without control characters (it is written into the job script and used as a "
            "directory name).",
    "name": "must be one file name: no '/', not '.' or '..', no control characters (it names a directory, which "
            "must stay where it belongs).",
}

# Every setting whose value reaches a script, a command line or a file name, with its kind.
SHELL_BOUND: dict[str, str] = {
    "cluster.partition": "plain", "cluster.account": "plain", "cluster.qos": "plain", "cluster.constraint": "plain",
    "cluster.exclude": "plain", "cluster.nodelist": "plain", "cluster.gpu_type": "plain",
    "cluster.additional_parameters": "plain",  # each value; each key an sbatch option name
    "cluster.srun_args": "word", "cluster.container.mounts": "word", "cluster.container.image": "word",
    "cluster.setup": "line", "cluster.python": "line",
    "output_root": "path", "sweep_dir": "path", "baseline": "path",
}

# String-valued settings that reach no script, command line or file name, and why.
NOT_SHELL_BOUND: dict[str, str] = {
    "model.name": "a choice among the built-in models (refused otherwise)",
    "model._target_": "imported by the ranks from spec.json (must be a dotted path that imports)",
    "model.target": "alias of model._target_",
    "model.params": "keyword arguments of the model, in spec.json",
    "model.arch": "a transformers architecture name, in spec.json",
    "model.config": "a transformers config, in spec.json",
    "model.config_path": "read by the ranks from spec.json",
    "model.pretrained_path": "read by the ranks from spec.json",
    "data.path": "read by the ranks from spec.json",
    "tracking.uri": "given to MLflow's client, checked as a store (never in a script)",
    "tracking.experiment": "an MLflow experiment name (launcher.report --experiment checks it as a name where it "
                           "names a directory)",
    "runs": "an int or auto (refused otherwise)",
}

_FIX = {
    "cluster.additional_parameters": "write the value plainly, e.g. cluster.additional_parameters.reservation=bench.",
    "cluster.srun_args": "write options as --name=value, one per entry.",
    "cluster.container.mounts": "write options as --name=value, one per entry.",
    "cluster.container.image": "use a registry path or file path, e.g. nvcr.io#nvidia/pytorch:24.05-py3 or "
                               "/shared/images/bench.sif.",
    "cluster.setup": "give one list entry per command, e.g. cluster.setup='[module load cuda, source "
                     "venv/bin/activate]'.",
    "cluster.python": "give the interpreter's path.",
}


def check(setting: str, value: Any, kind: str, fix: str | None = None) -> None:
    """The one check of a value that reaches a script, a command line or a file name."""
    if value is None:
        return
    text = str(value)
    bad = {"plain": lambda: not PLAIN.match(text), "word": lambda: not ARG.match(text),
           "line": lambda: bool(CONTROL.search(text)), "path": lambda: bool(CONTROL.search(text)),
           "name": lambda: bool(CONTROL.search(text)) or "/" in text or text in ("", ".", "..")}[kind]()
    if bad:
        name = setting.rpartition(".")[2]
        raise ConfigError(setting, value, _WHY[kind], fix or _FIX.get(setting) or {
            "plain": f"give the plain Slurm {name} name.", "path": "give a directory path on one line.",
            "name": "give a plain name, or --out DIR for where the report goes."}.get(kind, "give a plain value."))


def _at(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def check_config(config: Any) -> None:
    """Every SHELL_BOUND setting of a composed Config (launcher/plan/schema.py) through :func:`check`."""
    for setting, kind in SHELL_BOUND.items():
        value = _at(config, setting)
        if isinstance(value, dict):
            for key, item in value.items():
                if not re.fullmatch(r"[a-z][a-z0-9_]*", str(key)):
                    raise ConfigError(f"{setting}.{key}", item, "is not an sbatch option name.",
                                      "use the long option name with underscores, e.g. reservation or mail_type.")
                if not isinstance(item, bool):
                    check(f"{setting}.{key}", item, kind, _FIX.get(setting))
        elif isinstance(value, (list, tuple)):
            for item in value:
                check(setting, item, kind)
        else:
            check(setting, value, kind)
