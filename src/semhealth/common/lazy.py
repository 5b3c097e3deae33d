"""Names a package imports on first use (PEP 562), so that importing the package stays cheap.

The forwarding process imports package faces (``semhealth.agent``, ``semhealth.collectors``,
``semhealth.embeddings``) for their configuration types; the names that bring analysis,
OpenTelemetry or the encoders with them load where they are first used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def on_first_use(
    namespace: dict[str, Any], homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: ``homes`` maps each name to the module
    of the package (``namespace``, its ``globals()``) it is imported from."""
    package = namespace["__name__"]

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value  # once imported, a plain attribute
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *homes})

    return getattr_, dir_
