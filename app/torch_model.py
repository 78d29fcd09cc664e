"""The torch engine's model: a small decoder-only transformer (random weights from a
seed, nothing downloaded), batched greedy decoding, and the weights' checksum and
file format. Needs the ``torch`` extra."""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import torch
from torch import nn

__all__ = ["DecoderConfig", "TinyDecoder", "checksum", "greedy", "next_tokens", "save_weights"]


class DecoderConfig(msgspec.Struct, frozen=True):
    """Size of a :class:`TinyDecoder` (the default is ~1.7M parameters)."""

    vocab: int = 256
    width: int = 256
    layers: int = 2
    heads: int = 4
    context: int = 64
    seed: int = 0


class TinyDecoder(nn.Module):
    """A decoder-only transformer: token + position embeddings, pre-norm causal
    self-attention blocks (``torch.nn.TransformerEncoderLayer`` with a causal
    mask), a final norm and an output projection."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        gen = torch.Generator().manual_seed(config.seed)
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(config.width, config.heads, 4 * config.width,
                                       dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (0.02 if p.dim() > 1 else 0.0))
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.weight.fill_(1.0)
                    m.bias.fill_(0.0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, length, vocab]`` for token ids ``[batch, length]``."""
        length = ids.shape[1]
        pos = torch.arange(length)
        x = self.tokens(ids) + self.positions(pos)[None]
        mask = nn.Transformer.generate_square_subsequent_mask(length)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        out: torch.Tensor = self.head(self.norm(x))
        return out


@torch.no_grad()
def next_tokens(model: TinyDecoder, rows: list[list[int]]) -> list[int]:
    """One batched forward: the greedy next token of each row (rows may differ in
    length; they are right-padded, which a causal model does not see)."""
    ctx = model.config.context
    rows = [r[-ctx:] for r in rows]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    logits = model(ids)
    last = torch.tensor([len(r) - 1 for r in rows])
    picked = logits[torch.arange(len(rows)), last].argmax(dim=-1)
    return [int(t) for t in picked.tolist()]


def greedy(model: TinyDecoder, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Batched greedy decoding: ``new_tokens`` generated tokens per prompt."""
    model.eval()
    rows = [list(p) for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(new_tokens):
        for i, t in enumerate(next_tokens(model, rows)):
            rows[i].append(t)
            out[i].append(t)
    return out


def _raw_bytes(t: torch.Tensor) -> Any:
    t = t.detach().contiguous()
    return (ctypes.c_char * (t.numel() * t.element_size())).from_address(t.data_ptr())


def checksum(tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    items = sorted(tensors.items() if isinstance(tensors, Mapping) else tensors)
    h = hashlib.sha256()
    for name, t in items:
        t = t.detach().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(_raw_bytes(t))
    return h.hexdigest()


def save_weights(model: nn.Module, path: str, version: int) -> str:
    """Write ``model``'s weights to ``path`` (``torch.save``); returns their checksum."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    digest = checksum(state)
    torch.save({"version": version, "checksum": digest, "state": state}, path)
    return digest
