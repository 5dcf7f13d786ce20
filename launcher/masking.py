"""The one secret mask, for everything the launcher writes or prints: resolved configs, MLflow
params, error messages."""

from __future__ import annotations

import re
from typing import Any

SECRET_KEY = re.compile(r"(password|passwd|secret|token|api[_-]?key|credential)", re.IGNORECASE)
URI_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.\-]*://)(?P<user>[^:/@\s]+):(?P<pw>[^@/\s]+)@", re.IGNORECASE)
MASK = "***"


def mask(key: str, value: Any) -> Any:
    """The one secret mask: values of secret-looking keys, and passwords inside URIs in any text
    (error messages, resolved configs, MLflow params)."""
    if SECRET_KEY.search(key) and value not in (None, ""):
        return MASK
    if isinstance(value, str):
        return URI_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", value)
    return value
