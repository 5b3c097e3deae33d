# ruff: noqa: RUF001 -- the built-in corpus is Chinese as well as English: full-width
# punctuation there is meant.
"""The demo's built-in corpus, and finding the entry a query is about."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CorpusEntry:
    """One built-in topic: a question, a document that answers it, and the answer."""

    topic: str
    lang: str  # "en" or "zh"
    question: str
    document: str
    answer: str


CORPUS: tuple[CorpusEntry, ...] = (
    CorpusEntry(
        topic="photosynthesis",
        lang="en",
        question="How does photosynthesis turn sunlight into chemical energy?",
        document=(
            "Photosynthesis takes place in chloroplasts. Chlorophyll absorbs red and blue "
            "light; the light reactions split water, release oxygen and make ATP and NADPH, "
            "which the Calvin cycle uses to fix carbon dioxide into sugars."
        ),
        answer=(
            "Photosynthesis captures sunlight with chlorophyll in the chloroplasts. The light "
            "reactions split water, releasing oxygen and storing energy in ATP and NADPH. "
            "The Calvin cycle then spends that energy to fix carbon dioxide into glucose, "
            "which is the chemical energy the plant lives on."
        ),
    ),
    CorpusEntry(
        topic="http_caching",
        lang="en",
        question="What do the Cache-Control max-age and ETag headers do in HTTP caching?",
        document=(
            "Cache-Control: max-age=N lets a cache reuse a response for N seconds without "
            "asking the origin. An ETag identifies a version of a resource; a client "
            "revalidates with If-None-Match and gets 304 Not Modified when nothing changed."
        ),
        answer=(
            "Cache-Control max-age tells caches how many seconds a response stays fresh, so "
            "they can serve it without contacting the server. Once it is stale, the ETag lets "
            "the client revalidate cheaply: it sends If-None-Match with the tag, and the "
            "server answers 304 Not Modified instead of the full body if nothing changed."
        ),
    ),
    CorpusEntry(
        topic="python_gil",
        lang="en",
        question="Why does the Python GIL limit multithreaded CPU-bound code?",
        document=(
            "CPython's global interpreter lock lets only one thread execute Python bytecode at "
            "a time. Threads release it around blocking I/O, so I/O-bound programs scale, but "
            "CPU-bound threads take turns. Multiprocessing or native extensions avoid it."
        ),
        answer=(
            "In CPython the global interpreter lock allows only one thread to run Python "
            "bytecode at any moment. I/O-bound threads release the lock while they wait, so "
            "they overlap well, but CPU-bound threads just take turns on one core. Use "
            "multiprocessing, or native code that releases the lock, to use several cores."
        ),
    ),
    CorpusEntry(
        topic="kubernetes_probes",
        lang="en",
        question="What is the difference between a liveness probe and a readiness probe?",
        document=(
            "Kubernetes restarts a container whose liveness probe fails. A failing readiness "
            "probe removes the pod from Service endpoints without restarting it, so traffic "
            "only reaches pods that are ready to serve."
        ),
        answer=(
            "A liveness probe answers whether the container is still healthy: when it fails, "
            "the kubelet restarts the container. A readiness probe answers whether the pod "
            "should receive traffic: when it fails, the pod is taken out of the Service "
            "endpoints but keeps running until it recovers."
        ),
    ),
    CorpusEntry(
        topic="sourdough",
        lang="en",
        question="How do I keep a sourdough starter healthy?",
        document=(
            "A sourdough starter is a culture of wild yeast and lactic acid bacteria. Feed it "
            "equal weights of flour and water, keep it at room temperature, and discard part "
            "of it before each feeding; refrigerate it if you bake only weekly."
        ),
        answer=(
            "Feed your starter regularly with equal weights of flour and water, discarding "
            "part of it first so it does not grow out of hand. At room temperature it wants "
            "a feeding once or twice a day; if you bake only weekly, keep it in the fridge and "
            "feed it a day before baking until it doubles and smells pleasantly sour."
        ),
    ),
    CorpusEntry(
        topic="great_wall",
        lang="zh",
        question="长城是什么时候修建的？有多长？",
        document=(
            "长城始建于春秋战国时期，秦始皇统一六国后将各国长城连接起来。现存的长城大多为明代修建，"
            "根据国家文物局的测量，历代长城总长度约为两万一千公里。"
        ),
        answer=(
            "长城最早修建于春秋战国时期，秦朝统一后把各段城墙连成一体。我们今天看到的大部分长城"
            "是明代重修的。根据国家文物局的测量，历代长城的总长度约为两万一千公里。"
        ),
    ),
    CorpusEntry(
        topic="giant_panda",
        lang="zh",
        question="大熊猫主要吃什么？生活在哪里？",
        document=(
            "大熊猫是中国特有的物种，主要分布在四川、陕西和甘肃的山区竹林中。大熊猫的食物百分之九十"
            "以上是竹子，每天要花十几个小时进食。"
        ),
        answer=(
            "大熊猫主要吃竹子，竹子占它们食物的百分之九十以上，它们每天要花十几个小时进食。"
            "野生大熊猫生活在中国四川、陕西和甘肃的山区竹林里。"
        ),
    ),
    CorpusEntry(
        topic="green_tea",
        lang="zh",
        question="绿茶应该用多少度的水冲泡？",
        document=(
            "绿茶属于不发酵茶，茶叶较嫩。冲泡绿茶的水温一般在八十度左右，水温过高会破坏维生素，"
            "使茶汤变黄、味道发苦。"
        ),
        answer=(
            "冲泡绿茶最好用八十度左右的水。绿茶是不发酵茶，芽叶比较嫩，水温太高会把茶叶烫熟，"
            "茶汤容易变黄发苦，也会损失维生素。可以先把开水晾一会儿再冲泡。"
        ),
    ),
    CorpusEntry(
        topic="high_speed_rail",
        lang="zh",
        question="中国高铁的最高运营速度是多少？",
        document=(
            "中国高速铁路网是世界上规模最大的高铁网络。京沪高铁上的复兴号列车以每小时三百五十公里"
            "的速度运营，是目前世界上商业运营速度最快的轮轨列车之一。"
        ),
        answer=(
            "中国高铁的最高商业运营速度是每小时三百五十公里，京沪高铁上的复兴号就按这个速度运行。"
            "中国的高铁网络也是世界上规模最大的。"
        ),
    ),
)

FALLBACK = {
    "en": "I could not find anything about that in what I know; could you rephrase the question?",
    "zh": "抱歉，我没有找到与这个问题相关的信息，请换一种方式提问。",
}

STOPWORDS = frozenset(
    ("the", "and", "for", "with", "what", "how", "does", "why", "that", "this", "are", "can")
)


def query_text(body: Mapping[str, Any]) -> str:
    """The user's query in any of the simulated request shapes (last user turn, or prompt)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        return _content_text(users[-1].get("content")) if users else ""
    inputs = body.get("input")
    if isinstance(inputs, list):
        users = [m for m in inputs if isinstance(m, dict) and m.get("role") == "user"]
        return _content_text(users[-1].get("content")) if users else ""
    for key in ("input", "prompt", "inputs"):
        if isinstance(body.get(key), str):
            return str(body[key])
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [b.get("text") for b in content if isinstance(b, dict)]
        # A query sent with documents is the text block after them: the last one.
        texts = [p for p in parts if isinstance(p, str)]
        return texts[-1] if texts else ""
    return ""


def has_cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def _terms(text: str) -> set[str]:
    """Words for alphabetic text, character bigrams for Chinese (which has no spaces)."""
    words = {w for w in re.findall(r"[a-z0-9][a-z0-9-]+", text.lower()) if w not in STOPWORDS}
    cjk = [ch for ch in text if "\u4e00" <= ch <= "\u9fff"]
    bigrams = {a + b for a, b in itertools.pairwise(cjk)}
    return words | bigrams


def best_entry(query: str) -> CorpusEntry | None:
    """The corpus entry whose question and document share most terms with ``query``."""
    terms = _terms(query)
    scored = [(len(terms & _terms(e.question + " " + e.document)), e) for e in CORPUS]
    score, entry = max(scored, key=lambda pair: pair[0])
    return entry if score > 0 else None
