"""The reader of a cell's ``metrics.jsonl``, which rank 0 writes (jobs/sinks.py) and the launcher
reads (status, sync, report): one reading of a file cut short by a killed writer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl`` (none if it does not exist yet)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a killed writer: the rest is still good
    return out
