"""Values that end up in a shell, an sbatch script, a command line or a file name: one rule, checked
before submission.

submitit writes ``#SBATCH --key=value`` lines, joins ``srun_args`` into the srun command line and
pastes ``setup`` lines into the script; the sweep directory is written into the script's
``#SBATCH --output`` line. A newline in any of them would start a new script line (a new command
or a new #SBATCH directive); shell syntax in a value that is meant to be plain (a partition name)
would run. So every such setting says its kind (:func:`shell_bound`: :data:`SHELL_BOUND`, and the
cluster settings' own metadata), and :func:`check_config` puts each through the one check, :func:`check`:

* ``plain``: Slurm names and lists, letters, digits and ``. , : = @ % / + - _ [ ]`` only;
* ``word``: one shell word (srun and container arguments; ``#`` too, never first: Pyxis images);
* ``line``: one line without control characters; shell by design (``module load cuda``), the
  user's own command, but it may not smuggle in extra lines;
* ``command``: an interpreter, a path and its arguments (``/opt/venv/bin/python -X utf8``): words
  of ``word``'s characters separated by spaces, no shell syntax (``;``, ``$``, quotes, ``&&``); what
  should run before it belongs in ``setup`` lines;
* ``path``: a path written into the script or used as a directory: one line without control
  characters;
* ``name``: one file name component (a report directory named after an experiment): no ``/``,
  not ``.`` or ``..``, no control characters.

Every string-valued setting of the schema is either shell-bound or in :data:`NOT_SHELL_BOUND` with
the reason; tests/test_refusals.py walks the schema so that a new
setting cannot be added without saying which.
"""

from __future__ import annotations

import dataclasses
import re
import typing
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
    "command": "must be an interpreter's path and its arguments, plain words separated by spaces: no shell syntax "
               "(; & | $ ` quotes < > ( ) and the like; it is pasted unquoted into the srun line).",
    "path": "must be one line without control characters (it is written into the job script and used as a "
            "directory name).",
    "name": "must be one file name: no '/', not '.' or '..', no control characters (it names a directory, which "
            "must stay where it belongs).",
}

# Every setting outside ``cluster.*`` whose value reaches a script, a command line or a file name,
# with its kind. The cluster's settings say it in their fields' metadata (``shell(kind, fix)`` in
# launcher/plan/clusterschema.py and each backend's settings.py): :func:`shell_bound` reads both.
SHELL_BOUND: dict[str, str] = {"output_root": "path", "sweep_dir": "path", "baseline": "path"}

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
    "cluster.timeout_min": "a whole number of minutes or auto (refused otherwise); a number reaches sbatch --time",
    "tracking.uri": "given to MLflow's client, checked as a store (never in a script)",
    "tracking.experiment": "an MLflow experiment name (launcher.report --experiment checks it as a name where it "
                           "names a directory)",
    "runs": "an int or auto (refused otherwise)",
    "cells": "all or auto (refused otherwise)",
    "runs_max": "a whole number of runs or auto (refused otherwise); read by the launcher only",
    "runs_budget_min": "a positive number of minutes, auto or null (refused otherwise); read by the launcher only",
    "strategy.preset": "the preset file's name, compared with 'hsdp' and never written into a script",
    "cluster.name": "a backend's name, refused unless the registry knows it (launcher/cluster/registry.py)",
}



def check(setting: str, value: Any, kind: str, fix: str | None = None) -> None:
    """The one check of a value that reaches a script, a command line or a file name."""
    if value is None:
        return
    text = str(value)
    bad = {"plain": lambda: not PLAIN.match(text), "word": lambda: not ARG.match(text),
           "line": lambda: bool(CONTROL.search(text)), "path": lambda: bool(CONTROL.search(text)),
           "command": lambda: not text.strip() or not all(ARG.match(w) for w in text.split(" ") if w)
           or bool(CONTROL.search(text)),
           "name": lambda: bool(CONTROL.search(text)) or "/" in text or text in ("", ".", "..")}[kind]()
    if bad:
        name = setting.rpartition(".")[2]
        raise ConfigError(setting, value, _WHY[kind], fix or {
            "plain": f"give the plain Slurm {name} name.", "path": "give a directory path on one line.",
            "name": "give a plain name, or --out DIR for where the report goes."}.get(kind, "give a plain value."))


def _fields(cls: type, prefix: str) -> dict[str, tuple[str, str | None]]:
    """{dotted key: (kind, fix)} of the fields of dataclass ``cls`` whose metadata says a kind."""
    out: dict[str, tuple[str, str | None]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if "shell" in f.metadata:
            out[prefix + f.name] = (f.metadata["shell"], f.metadata.get("fix"))
        elif dataclasses.is_dataclass(hints[f.name]):
            out.update(_fields(hints[f.name], f"{prefix}{f.name}."))
    return out


def shell_bound(*cluster_classes: type) -> dict[str, tuple[str, str | None]]:
    """{setting: (kind, fix)} of every setting that reaches a script: :data:`SHELL_BOUND`, and the
    cluster settings of ``cluster_classes`` (ClusterConfig.subtypes(): of every backend)."""
    out: dict[str, tuple[str, str | None]] = {key: (kind, None) for key, kind in SHELL_BOUND.items()}
    for cls in cluster_classes:
        out.update(_fields(cls, "cluster."))
    return out


def _at(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def check_config(config: Any) -> None:
    """Every shell-bound setting of a composed Config (launcher/plan/schema.py) through :func:`check`."""
    for setting, (kind, fix) in shell_bound(type(config.cluster)).items():
        value = _at(config, setting)
        if isinstance(value, dict):
            for key, item in value.items():
                if not re.fullmatch(r"[a-z][a-z0-9_]*", str(key)):
                    raise ConfigError(f"{setting}.{key}", item, "is not an sbatch option name.",
                                      "use the long option name with underscores, e.g. reservation or mail_type.")
                if not isinstance(item, bool):
                    check(f"{setting}.{key}", item, kind, fix)
        elif isinstance(value, (list, tuple)):
            for item in value:
                check(setting, item, kind, fix)
        else:
            check(setting, value, kind, fix)
