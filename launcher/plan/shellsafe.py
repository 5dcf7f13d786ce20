"""Values that end up in a shell or an sbatch script, checked before submission.

submitit writes ``#SBATCH --key=value`` lines, joins ``srun_args`` into the srun command line and
pastes ``setup`` lines into the script. A newline in any of them would start a new script line
(a new command or a new #SBATCH directive); shell syntax in a value that is meant to be plain
(a partition name) would run. So plain values must be plain, and each setup entry must be one
line. Setup lines themselves are shell by design (``module load cuda``, ``source venv``): they are
the user's own commands, but they may not smuggle in extra lines or control characters.
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


def _plain(setting: str, value: Any, fix: str) -> None:
    if value is not None and not PLAIN.match(str(value)):
        raise ConfigError(setting, value, "may hold letters, digits and . , : = @ % / + - _ [ ] only "
                          "(it is written into the sbatch script, where anything else is shell syntax).", fix)


def check_cluster(cluster) -> None:
    for key in ("partition", "account", "qos", "constraint", "exclude", "gpu_type"):
        _plain(f"cluster.{key}", getattr(cluster, key), f"give the plain Slurm {key} name.")
    for key, value in cluster.additional_parameters.items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", str(key)):
            raise ConfigError(f"cluster.additional_parameters.{key}", value, "is not an sbatch option name.",
                              "use the long option name with underscores, e.g. reservation or mail_type.")
        if not isinstance(value, bool):
            _plain(f"cluster.additional_parameters.{key}", value,
                   "write the value plainly, e.g. cluster.additional_parameters.reservation=bench.")
    for items, setting in ((cluster.srun_args, "cluster.srun_args"), (cluster.container.mounts, "cluster.container.mounts")):
        for arg in items:
            if not ARG.match(str(arg)):
                raise ConfigError(setting, arg, "each entry must be one shell word without quotes, spaces or "
                                  "shell syntax.", "write options as --name=value, one per entry.")
    image = cluster.container.image
    if image is not None and not ARG.match(str(image)):
        raise ConfigError("cluster.container.image", image, "must be one word without spaces or shell syntax.",
                          "use a registry path or file path, e.g. nvcr.io#nvidia/pytorch:24.05-py3 or "
                          "/shared/images/bench.sif.")
    for line in cluster.setup:
        if CONTROL.search(str(line)):
            raise ConfigError("cluster.setup", line, "each setup entry must be a single line (a newline or control "
                              "character would add hidden lines to the job script).",
                              "give one list entry per command, e.g. cluster.setup='[module load cuda, source venv/bin/activate]'.")
    if cluster.python is not None and CONTROL.search(cluster.python):
        raise ConfigError("cluster.python", cluster.python, "must be one line.", "give the interpreter's path.")
