"""Grid expansion, composition and validation: the command line's overrides -> typed, validated
points (:func:`expand`, :func:`compose`).

Everything here runs before anything is submitted: a sweep is either valid as a whole or
nothing is sent. Hydra's override grammar expands the grid (``a=1,2 b=x,y`` -> 4 points, or a
named experiment's own grid), and Hydra's compose API builds each point against the typed schema
once per distinct set of group choices, each point's values then set on a copy (directly, or by
Hydra's own step where a value needs it); every invalid point is reported in one error, each
problem once. No torch or MLflow import. A point's resources and its cell are
launcher/plan/planner.py's.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from contract.spec import ConfigError, non_finite
from launcher.plan.clusterschema import ClusterConfig, settings_class
from launcher.plan.configdirs import initialized
from launcher.plan.configdirs import search_path as search_path  # the command line's --config-dir
from launcher.plan.schema import Config
from launcher.plan.schemakeys import did_you_mean, field_type, read_by, schema_keys, unknown_keys

# Package data: found next to this module in a checkout, an editable install and a wheel alike.
CONF_DIR = Path(str(importlib.resources.files("launcher") / "conf"))


class SweepError(Exception):
    """One or more grid points are invalid; the message lists each, with its fix."""


@dataclass
class Point:
    overrides: list[str]
    swept: dict[str, str]  # the keys that vary across the sweep, with this point's values
    config: Config


def experiment_grid(overrides: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """The grid a named experiment declares (``+experiment=NAME``: its ``hydra.sweeper.params``), as
    overrides; a key also given on the command line keeps the command line's values, as in Hydra."""
    chosen = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "experiment"]
    if not chosen:
        return []
    from hydra import compose as hydra_compose
    from omegaconf import OmegaConf

    from launcher.plan.schema import register

    register()
    with initialized(CONF_DIR, extra):
        cfg = hydra_compose(config_name="config", overrides=[*chosen, *extra], return_hydra_config=True)
    # An experiment may fix settings without a grid of its own (noise_floor): no sweeper params.
    params = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.params is not None else {}
    assert isinstance(params, dict)  # a mapping in Hydra's schema
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    return [f"{key!s}={value}" for key, value in params.items() if str(key) not in given]


def expand(overrides: Sequence[str], multirun: bool, extra: Sequence[str] = ()) -> tuple[list[list[str]], list[str]]:
    """The override list of every grid point, and the keys being swept (an experiment's grid included)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    overrides = [*overrides, *experiment_grid(overrides, extra)]
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as exc:
        raise SweepError(parse_error(overrides)) from exc
    swept = [o.key_or_group for o in parsed if o.is_sweep_override()]
    if swept and not multirun:
        one = next(o for o in overrides if o.split("=", 1)[0].lstrip("+~") == swept[0])
        raise SweepError(
            f"{', '.join(swept)}: several values need a multirun. Fix: add -m (python -m launcher -m {' '.join(overrides)})"
            f"; or, if it is one value that contains commas (a Slurm node list), quote it: {quoted(one)}."
        )
    if not multirun:
        return [list(overrides)], []
    return grid_points(parsed), swept


def grid_points(parsed: Sequence) -> list[list[str]]:
    """Every combination of the swept values, in the order Hydra's basic sweeper runs them (its
    ``split_arguments``, written with the overrides' public methods): the last key varies fastest,
    and a key given twice keeps its last place and value."""
    import itertools

    choices: dict[str, list[str]] = {}
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override() and not override.is_discrete_sweep():
            raise SweepError(f"{key}: an interval sweep ({override.input_line}) has no values to list; the basic "
                             f"sweeper runs choices and ranges. Fix: list the values, or use range(start,stop,step).")
        choices[key] = ([f"{key}={v}" for v in override.sweep_string_iterator()] if override.is_sweep_override()
                        else [f"{key}={override.get_value_element_as_str()}"])
    return [list(point) for point in itertools.product(*choices.values())]


def quoted(override: str) -> str:
    """``key=value`` as the shell word that gives Hydra the value as one quoted string:
    ``cluster.exclude=node[2-4]`` -> ``'cluster.exclude="node[2-4]"'``."""
    import shlex

    key, _, value = override.partition("=")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return shlex.quote(f'{key}="{escaped}"')


def parse_error(overrides: Sequence[str]) -> str:
    """Why Hydra's override grammar refused the command line, and the quoted form that it takes.
    Brackets, braces, parentheses, quotes, ``$`` and ``=`` are grammar in a value; inside quotes they
    are text (a Slurm node list ``node[2-4]``, an argument with spaces)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException as exc:
            detail = str(exc).splitlines()[0]
            if "=" not in override:
                return (f"{override!r} is not an override ({detail}). Fix: write overrides as key=value "
                        f"(see python -m launcher --help).")
            return (f"{override!r}: Hydra's override grammar cannot read this value ({detail}): brackets, braces, "
                    f"parentheses, quotes and commas have a meaning there. Fix: quote the value for Hydra and the "
                    f"shell, e.g. {quoted(override)}.")
    return "the overrides cannot be parsed together. Fix: write them as key=value (see python -m launcher --help)."


def _explain(exc: BaseException, overrides: list[str]) -> str:
    """One paragraph for a composition error: no traceback, the setting and the fix."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    where = " ".join(overrides) or "(defaults)"
    if isinstance(exc, ConfigError):
        return f"[{where}] {exc}"
    if isinstance(exc, MissingConfigException):
        broken = _broken_backend(exc.missing_cfg_file or "")
        if broken is not None:
            return f"[{where}] {broken}"
        group = (exc.missing_cfg_file or "").split("/")[0] if exc.missing_cfg_file else ""
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")) if group else []
        hint = f" Fix: pick one of {', '.join(options)}." if options else ""
        first = str(exc).splitlines()[0]
        return f"[{where}] {first}.{hint}"
    if isinstance(exc, OmegaConfBaseException):
        key = getattr(exc, "full_key", None) or "?"
        msg = getattr(exc, "msg", str(exc)).splitlines()[0]
        if "not in struct" in msg or "not in '" in msg:
            fix = f"{did_you_mean(key)} (python -m launcher --help lists the settings.)"
        else:
            fix = f"give {key} a value of the right type (see conf/ and docs/configuration.md)."
        return f"[{where}] {key}: {msg}. Fix: {fix}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        return _explain(cause, overrides)
    return f"[{where}] {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _broken_backend(missing: str) -> ConfigError | None:
    """Why ``cluster/NAME_schema`` is missing where NAME is a site's backend that cannot be imported:
    its entry point and the import error (launcher/cluster/registry.py left it out of the schema)."""
    from launcher.cluster import registry

    name = missing.removeprefix("cluster/").removesuffix("_schema")
    if not (missing.startswith("cluster/") and missing.endswith("_schema")) or name not in registry.known() \
            or name in registry.usable():
        return None
    try:
        registry.load(name, "settings")
    except ConfigError as exc:
        return exc
    return None


def _changes_composition(override: str, config_dir: Path) -> bool:
    """Whether an override changes what Hydra composes (a config group, an addition or deletion, a
    package, Hydra's own settings) rather than a value of the composed config (``nodes=2``)."""
    key = override.split("=", 1)[0]
    if "=" not in override or key.startswith(("+", "~", "hydra")) or "/" in key or "@" in key:
        return True
    return (config_dir / key).is_dir()


def compose(point_overrides: list[list[str]], swept: list[str], config_dir: Path = CONF_DIR,
            extra: Sequence[str] = ()) -> list[Point]:
    """Compose and validate every point; raise SweepError listing every invalid one.

    Hydra composes once per distinct set of group choices; each point then gets its value
    overrides applied to a copy, by the function Hydra's own compose applies them with (after
    composing the defaults list). The result is the same config, and a 16-point grid over
    strategy x precision x nodes x seed composes 4 times instead of 16 (~65 ms each).
    """
    import copy

    from hydra import compose as hydra_compose
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from launcher.plan.schema import register

    register()
    parser = OverridesParser.create()
    templates: dict[tuple[str, ...], tuple[Any, Config, bool]] = {}
    cache: dict[str, object] = {}  # override text -> parsed: a grid repeats the same few (ANTLR is slow)
    points, errors = [], []
    with initialized(config_dir, extra):
        for overrides in point_overrides:
            groups = tuple([*extra, *(o for o in overrides if _changes_composition(o, config_dir))])
            values = [o for o in overrides if not _changes_composition(o, config_dir)]
            try:
                if groups not in templates:
                    templates[groups] = _template(hydra_compose(config_name="config", overrides=list(groups)))
                template, base, interpolates = templates[groups]
                parsed = [_parse(parser, cache, o) for o in values]
                # An interpolation (hsdp's shard group of ${cluster.tasks_per_node}) follows the values
                # set after it only through Hydra's own way: the objects hold it resolved already.
                fast = None if interpolates else _fast_apply(base, parsed)
                if fast is None:  # anything but plain scalar values: Hydra's own way, ~10x slower
                    cfg = copy.deepcopy(template)
                    # Hydra's private step (hydra-core 1.3) that its compose applies value overrides
                    # with: composing each point publicly gives the same config ~3x slower (figure 4's
                    # 16 points: 7.6 s against 2.6 s). tests/test_private_apis.py fails, naming it,
                    # where a Hydra release moves or changes it.
                    ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
                    config = cast(Config, OmegaConf.to_object(cfg))
                else:
                    config = fast
                _check_finite(config)
                config.validate()
            except Exception as exc:  # every kind of bad input becomes one readable line
                errors.append((" ".join(overrides) or "(defaults)", _explain(exc, overrides)))
                continue
            # "+model.params.x=1" sweeps the key "model.params.x": its value is found without the prefix.
            values_by_key = {k.lstrip("+~"): v for k, v in (o.split("=", 1) for o in overrides if "=" in o)}
            points.append(Point(overrides, {k.lstrip("+~"): values_by_key.get(k, "") for k in swept}, config))
    if errors:
        raise SweepError(_grouped(errors))
    return points


def _parse(parser, cache: dict[str, object], override: str):
    if override not in cache:
        cache[override] = parser.parse_override(override)
    return cache[override]


def _template(cfg) -> tuple[object, Config, bool]:
    """A composed config made ready for value overrides (open dicts unlocked, every key known), its
    objects (the base that the fast path copies), and whether it holds an interpolation."""
    from omegaconf import OmegaConf

    _typed_cluster(cfg)
    _open_dicts(cfg)
    tree = cast(dict, OmegaConf.to_container(cfg, resolve=False))
    _check_keys(tree)
    return cfg, cast(Config, OmegaConf.to_object(cfg)), "${" in repr(tree)


def _typed_cluster(cfg) -> None:
    """A cluster composed without its backend's settings class (a site's conf/cluster/NAME.yaml that
    sets only the shared settings, and no ``defaults: [BACKEND_schema, _self_]``) is read as that class
    here, so it holds its backend's defaults and refuses what its backend does not read."""
    from omegaconf import OmegaConf

    if OmegaConf.get_type(cfg.cluster) is ClusterConfig:
        shared = OmegaConf.to_container(cfg.cluster, resolve=False)
        cfg.cluster = OmegaConf.merge(OmegaConf.structured(settings_class(str(cfg.cluster.name))), shared)


def _fast_apply(base: Config, parsed) -> Config | None:
    """``base`` with plain scalar overrides set directly on a copy of its objects, or None when any
    override needs Hydra's own handling (a new key, a deletion, a list or dict, an interpolation, a
    value that needs conversion or is of the wrong type: those get Hydra's checks and messages).

    A 1000-point grid over seeds then costs milliseconds per point instead of a DictConfig deepcopy,
    override and to_object each (~30 ms)."""
    import copy

    from hydra.core.override_parser.types import OverrideType

    changes = []
    for o in parsed:
        value = o.value()
        if o.type is not OverrideType.CHANGE or o.package or not isinstance(value, (bool, int, float, str, type(None))):
            return None
        if isinstance(value, str) and "${" in value:
            return None
        changes.append((o.key_or_group.split("."), value))
    config = copy.deepcopy(base)
    for path, value in changes:
        owner: Any = config
        for part in path[:-1]:
            owner = getattr(owner, part, None)
            if not dataclasses.is_dataclass(owner):
                return None
        coerced = _coerce(field_type(type(owner), path[-1]), value)
        if coerced is _NO:
            return None
        setattr(owner, path[-1], coerced)
    return config


_NO = object()


def _coerce(tp, value):
    """``value`` as the field type ``tp`` wants it, when no conversion is involved; else _NO."""
    import enum
    import typing

    if tp is None:
        return _NO
    if tp is typing.Any:  # runs: an int or "auto", checked by Config.validate
        return value
    args = typing.get_args(tp)
    if type(None) in args:
        if value is None:
            return None
        tp = next(a for a in args if a is not type(None))
    if tp is bool:
        return value if isinstance(value, bool) else _NO
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO
    if tp is float:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _NO
    if tp is str:
        return value if isinstance(value, str) else _NO
    if isinstance(tp, type) and issubclass(tp, enum.Enum) and isinstance(value, str) and value in tp.__members__:
        return tp[value]
    return _NO


def _grouped(errors: list[tuple[str, str]]) -> str:
    """One paragraph per distinct problem: a mistake shared by 1000 grid points is said once, with
    the first point and how many more have it."""
    by_problem: dict[str, list[str]] = {}
    for where, text in errors:
        problem = text[len(where) + 3:] if text.startswith(f"[{where}] ") else text
        by_problem.setdefault(problem, []).append(where)
    lines = []
    for problem, wheres in by_problem.items():
        more = f" (and {len(wheres) - 1} more grid point(s))" if len(wheres) > 1 else ""
        lines.append(f"[{wheres[0]}]{more} {problem}")
    return "\n".join(lines)


def _open_dicts(cfg) -> None:
    """Dict-typed settings (model.params, cluster.additional_parameters) take any key, also as a whole
    dict (``model.params={width: 96}``): Hydra's struct flag would refuse keys they do not hold yet."""
    from omegaconf import OmegaConf

    for key, is_open in schema_keys().items():
        node = OmegaConf.select(cfg, key)
        if is_open and node is not None:
            OmegaConf.set_struct(node, False)


def _check_keys(tree: dict) -> None:
    """A key nobody reads is an error: ``+nodez=2`` or ``+strategy.bucket_capmb=10`` would run the defaults."""
    unknown = unknown_keys(tree)
    if unknown:
        key = unknown[0]
        why = (f"is not read by cluster={_value_at(tree, 'cluster.name')}." if read_by(key)
               else "is not a setting of this tool (nothing would read it).")
        raise ConfigError(key, _value_at(tree, key), why,
                          f"{did_you_mean(key)} Keys may be added only inside open dicts: "
                          f"{', '.join(k for k, is_open in schema_keys().items() if is_open)}.")


def _value_at(tree: dict, key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _check_finite(config: Config) -> None:
    bad = non_finite(config)
    if bad:
        value = _value_of(config, bad[0])
        raise ConfigError(bad[0], value, "is NaN or infinite.", f"give {bad[0]} a finite number.")


def _value_of(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if isinstance(obj, list):
            obj = obj[int(part)]
        else:
            obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj
