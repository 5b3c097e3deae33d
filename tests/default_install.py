"""Python source that, run first in a fresh interpreter, makes it look like a default install:
sentence-transformers and torch (the `local` extra) can be neither found nor imported."""

HIDE_LOCAL_EXTRA = """
import sys

class _HideLocalExtra:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("sentence_transformers", "torch"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _HideLocalExtra())
"""
