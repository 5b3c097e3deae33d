"""Expand the hand-written items of ``hard_items.jsonl`` into the labelled ``hard_pairs.jsonl``.

Each item is a query with texts written for it (see README.md here). The pairs that need
no writing, long contexts and mixed-language negatives, are assembled from other items'
texts, only ever from the same split and language, so no held-out or unseen text is seen
while fitting. Deterministic: running it again gives the same file.

    python src/semhealth/embeddings/data/build_hard_pairs.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ITEMS = HERE / "hard_items.jsonl"
PAIRS = HERE / "hard_pairs.jsonl"
LONG_PASSAGES = 9  # passages in a long context: about 300 English words, 600 characters


@dataclass(frozen=True, slots=True)
class Item:
    item: str
    lang: str
    domain: str
    split: str
    query: str
    relevant: str
    near_miss: str
    same_domain: str
    cross: str | None = None


def load_items(path: Path = ITEMS) -> list[Item]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Item(**json.loads(line)) for line in lines if line.strip()]


def _pair(
    item: Item, kind: str, context: str, label: int, lang: str | None = None
) -> dict[str, object]:
    return {
        "id": f"{item.item}-{kind}",
        "query": item.query,
        "context": context,
        "label": label,
        "lang": lang or item.lang,
        "split": item.split,
        "kind": kind,
        "domain": item.domain,
    }


def _others(item: Item, items: list[Item]) -> list[str]:
    """Passages of the other items of the same language and split, in a fixed order."""
    peers = [o for o in items if o.lang == item.lang and o.split == item.split and o != item]
    return [text for o in peers for text in (o.relevant, o.near_miss, o.same_domain)]


def _long(item: Item, items: list[Item], own: list[str]) -> str:
    """``own`` passages among others', the first of them at a position set by the item."""
    others = _others(item, items)
    start = int(item.item[-2:]) * 3 % max(len(others), 1)
    filler = (others[start:] + others[:start])[: LONG_PASSAGES - len(own)]
    passages = [*filler]
    at = int(item.item[-2:]) % LONG_PASSAGES
    for offset, text in enumerate(own):
        passages.insert(min(at + offset, len(passages)), text)
    joiner = "\n\n"
    return joiner.join(passages)


def _mixed_negative(item: Item, items: list[Item]) -> str | None:
    """The other language's passage for the same domain and split that answers another query."""
    for other in items:
        if other.lang != item.lang and other.domain == item.domain and other.split == item.split:
            return other.relevant
    return None


def expand(items: list[Item]) -> list[dict[str, object]]:
    pairs: list[dict[str, object]] = []
    for item in items:
        pairs += [
            _pair(item, "relevant", item.relevant, 1),
            _pair(item, "near_miss", item.near_miss, 0),
            _pair(item, "same_domain", item.same_domain, 0),
            _pair(item, "long_relevant", _long(item, items, [item.relevant]), 1),
            _pair(
                item, "long_irrelevant", _long(item, items, [item.near_miss, item.same_domain]), 0
            ),
        ]
        if item.cross is not None:
            mixed = "mixed"
            pairs.append(_pair(item, "mixed_relevant", item.cross, 1, lang=mixed))
            negative = _mixed_negative(item, items)
            if negative is not None:
                pairs.append(_pair(item, "mixed_irrelevant", negative, 0, lang=mixed))
    return pairs


def main() -> None:
    rows = expand(load_items())
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    PAIRS.write_text(text, encoding="utf-8")
    print(f"wrote {len(rows)} pairs to {PAIRS.name}")


if __name__ == "__main__":
    main()
