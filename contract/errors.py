"""The project's configuration errors and the checks every part of a spec makes (standard library only).

:class:`ConfigError` is the one way a bad setting is reported, wherever it is found: the
launcher's composition, the ranks' ``python -m jobs``, the parallel layout's construction."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


class ConfigError(ValueError):
    """A bad setting, reported as one paragraph: setting, value, why, and the fix."""

    def __init__(self, setting: str, value: Any, problem: str, fix: str) -> None:
        self.setting, self.value, self.problem, self.fix = setting, value, problem, fix
        super().__init__(f"{setting}={value!r}: {problem} Fix: {fix}")



def positive(setting: str, value: Any, fix: str) -> None:
    # NaN compares false with everything: checked apart, or lr=NaN would pass "not <= 0".
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(setting, value, "must be a positive (finite) number.", fix)


def non_negative(setting: str, value: Any, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(setting, value, "must be zero or a positive (finite) number.", fix)


def non_finite(obj: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose value is a float NaN or infinity (a YAML .nan, lr=nan on the command line, a
    NaN in a spec.json): no setting of this schema means anything by one."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [k for f in dataclasses.fields(obj) for k in non_finite(getattr(obj, f.name), f"{prefix}{f.name}.")]
    if isinstance(obj, dict):
        return [k for name, v in obj.items() for k in non_finite(v, f"{prefix}{name}.")]
    if isinstance(obj, (list, tuple)):
        return [k for i, v in enumerate(obj) for k in non_finite(v, f"{prefix}{i}.")]
    return [prefix[:-1]] if isinstance(obj, float) and not math.isfinite(obj) else []

