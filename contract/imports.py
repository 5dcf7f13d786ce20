"""Why a module does not import here, naming the package that provides it (standard library only).

Used before submission (a ``_target_`` model's module, a transformers model) and by the ranks when
they build a model, so that both sides word the same problem the same way.
"""

from __future__ import annotations

# Modules whose package has another name on PyPI (the rest: the package is named as its module).
PACKAGE_OF_MODULE = {"sklearn": "scikit-learn", "cv2": "opencv-python", "PIL": "Pillow", "yaml": "PyYAML",
                     "skimage": "scikit-image", "google": "protobuf", "attr": "attrs"}


def install_hint(module: str) -> str:
    """``pip install <the package that provides module>``."""
    top = module.split(".")[0]
    return f"pip install {PACKAGE_OF_MODULE.get(top, top)}"


def import_problem(dotted: str) -> str | None:
    """Why the module path ``dotted`` (whose tail may be attributes of a module) does not import here,
    naming the module that is missing and the package that provides it; None when it imports (the
    attributes are checked when the model is built). Imports the parent packages, as finding does."""
    import importlib.util

    try:
        if importlib.util.find_spec(dotted) is not None:
            return None
        missing = dotted
    except ModuleNotFoundError as exc:
        missing = exc.name or dotted
    except Exception as exc:  # a parent package raised while importing: its own missing library, a broken build
        parent = dotted.rpartition(".")[0] or dotted
        return f"importing {parent} fails here with {type(exc).__name__}: {exc}"
    if missing != dotted and not dotted.startswith(missing + "."):
        # A dependency of a parent package, not the path itself.
        return (f"importing {dotted.rpartition('.')[0]} needs the module {missing!r}, which is not installed here "
                f"({install_hint(missing)})")
    parent = dotted.rpartition(".")[0]
    if parent:
        return import_problem(parent)  # the tail may be a class (or a class's attribute) of the parent
    return f"the module {dotted!r} is not installed here ({install_hint(dotted)})"
