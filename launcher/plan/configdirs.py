"""A site's own config directories (``--config-dir``) on Hydra's search path, before the packaged
configs: a site keeps its cluster/*.yaml and experiment/*.yaml out of the package, and a file of a
packaged name (``cluster/local.yaml``) wins over the packaged one (docs/configuration.md).

Hydra appends ``hydra.searchpath`` after its primary directory (the packaged configs), where a site's
file of a packaged name would never be read; a search path plugin may prepend (Hydra's public
SearchPathPlugin, registered by hand through ``Plugins.register``). The override stays, as Hydra's
record of the directories, and is how they travel from the command line to every composition.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


def search_path(config_dirs: Sequence[str | Path]) -> list[str]:
    """The override that names the site's config directories, in their order."""
    if not config_dirs:
        return []
    return ["hydra.searchpath=[" + ",".join(f"file://{Path(d).resolve()}" for d in config_dirs) + "]"]


def site_dirs(extra: Sequence[str]) -> tuple[str, ...]:
    """The directories of :func:`search_path`'s override in ``extra``, in their order."""
    for override in extra:
        key, _, value = override.partition("=")
        if key == "hydra.searchpath":
            return tuple(d.strip() for d in value.strip("[]").split(",") if d.strip())
    return ()


@functools.cache
def _site_first() -> Any:
    """The plugin class (made once: Hydra keeps the classes registered with it)."""
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    class SiteConfigsFirst(SearchPathPlugin):
        dirs: tuple[str, ...] = ()

        def manipulate_search_path(self, search_path) -> None:
            for d in self.dirs:  # each before the packaged configs ("main"), in the order given
                search_path.prepend("--config-dir", d, anchor="main")

    return SiteConfigsFirst


@contextlib.contextmanager
def initialized(config_dir: Path, extra: Sequence[str] = ()) -> Iterator[None]:
    """Hydra initialised on ``config_dir`` (the packaged configs), the site's directories of ``extra``
    searched before it."""
    from hydra import initialize_config_dir
    from hydra.core.plugins import Plugins

    plugin = _site_first()
    Plugins.instance().register(plugin)  # a class already registered is kept once
    plugin.dirs = site_dirs(extra)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            yield
    finally:
        plugin.dirs = ()
