"""How many examples a fuzz property runs: its own CI count, or the deep profile's.

The ``ci`` profile (tests/conftest.py) keeps Hypothesis' default of 100 examples; the
costlier properties here ask for fewer under it so the fuzz suite stays quick. Under the
``deep`` profile every property runs the profile's count (at least 100,000).
"""

from __future__ import annotations

from hypothesis import settings

DEEP_EXAMPLES = 100_000


def examples(ci: int) -> settings:
    """``ci`` examples under the ci profile; the loaded profile's count under deep."""
    default = settings.default
    loaded = default.max_examples if default is not None else 0
    return settings(max_examples=loaded if loaded >= DEEP_EXAMPLES else ci)
