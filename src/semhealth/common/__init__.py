"""What every semhealth package may import: the error root and the one ``Issue`` type, text
facts (CJK detection, token estimates), the words messages use, CPU counting, and package
faces whose names load on first use (``lazy``).

A leaf: it imports nothing of ours, and nothing here pulls a third-party dependency, so the
forwarding process can import it for free.
"""

from semhealth.common.cpus import available_cpus
from semhealth.common.errors import Issue, IssuesError, SemhealthError
from semhealth.common.text import CJK, CJK_CLASS, cjk_count, estimate_tokens, has_cjk, utf8_safe
from semhealth.common.words import kind_of, show

__all__ = [
    "CJK",
    "CJK_CLASS",
    "Issue",
    "IssuesError",
    "SemhealthError",
    "available_cpus",
    "cjk_count",
    "estimate_tokens",
    "has_cjk",
    "kind_of",
    "show",
    "utf8_safe",
]
