"""BERT-family encoder (BertModel: embeddings + post-LayerNorm transformer layers), for sentence embeddings.

The layout and names follow Hugging Face's `BertModel` so a checkpoint loads tensor for tensor (strictly: a
missing, unexpected or wrongly shaped tensor is an error). Only what embedding models use is here: absolute
position embeddings, token type 0 unless given, bidirectional attention with a padding mask, no pooler head
(sentence pooling is the caller's: mean over the tokens, as sentence-transformers does).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

_ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                "relu": F.relu}


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    pad_token_id: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_dict(cls, d: dict, where: str = "config.json") -> BertConfig:  # type: ignore[type-arg]
        if d.get("model_type") != "bert":
            raise ValueError(f"{where}: model_type {d.get('model_type')!r} is not 'bert'; the encoder serves "
                             "BERT-family embedding models (e.g. bundled:all-minilm-l6-v2)")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{where}: position_embedding_type {d['position_embedding_type']!r} is not supported "
                             "(only 'absolute')")
        act = d.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"{where}: hidden_act {act!r} is not supported; known: {', '.join(_ACTIVATIONS)}")
        cfg = cls(vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], num_layers=d["num_hidden_layers"],
                  num_heads=d["num_attention_heads"], intermediate_size=d["intermediate_size"],
                  max_position_embeddings=d["max_position_embeddings"], type_vocab_size=d.get("type_vocab_size", 2),
                  layer_norm_eps=d.get("layer_norm_eps", 1e-12), hidden_act=act, pad_token_id=d.get("pad_token_id")
                  or 0)
        if cfg.hidden_size % cfg.num_heads:
            raise ValueError(f"{where}: hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads "
                             f"{cfg.num_heads}")
        return cfg

    @classmethod
    def load(cls, model_dir: str | Path) -> BertConfig:
        path = Path(model_dir) / "config.json"
        return cls.from_dict(json.loads(path.read_text()), str(path))


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        # input_ids: [B, T] -> [B, T, H]
        T = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.position_embeddings.weight[:T]
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class BertLayer(nn.Module):
    """Self-attention and MLP, each followed by residual + LayerNorm (post-norm, as BERT)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        H, I = cfg.hidden_size, cfg.intermediate_size
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.attn_out = nn.Linear(H, H)
        self.attn_norm = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(H, I)
        self.out = nn.Linear(I, H)
        self.out_norm = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # x: [B, T, H]; mask: [B, 1, 1, T] additive (0 keep, -inf-ish drop) or None when nothing is padded
        B, T, H = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, heads, T, head_dim]
            return t.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(self.head_dim))
        a = a.transpose(1, 2).reshape(B, T, H)
        x = self.attn_norm(self.attn_out(a) + x)
        return self.out_norm(self.out(self.act(self.intermediate(x))) + x)


class BertModel(nn.Module):
    """[B, T] token ids + [B, T] attention mask (1 real, 0 padding) -> [B, T, hidden] last hidden states."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embeddings(input_ids, token_type_ids)
        mask = None
        if not bool(attention_mask.all()):
            # Additive mask broadcast over heads and query positions: padded keys get the dtype's minimum.
            keep = attention_mask[:, None, None, :].to(torch.bool)
            mask = torch.zeros(keep.shape, dtype=x.dtype).masked_fill(~keep, torch.finfo(x.dtype).min)
        for layer in self.layers:
            x = layer(x, mask)
        return x


def _weight_names(i: int) -> dict[str, str]:
    """Our parameter names of layer i -> Hugging Face's."""
    hf = f"encoder.layer.{i}."
    ours = f"layers.{i}."
    pairs = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
             "attn_out": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
             "intermediate": "intermediate.dense", "out": "output.dense", "out_norm": "output.LayerNorm"}
    return {f"{ours}{o}.{p}": f"{hf}{h}.{p}" for o, h in pairs.items() for p in ("weight", "bias")}


def _checkpoint_name(name: str, stored: set[str]) -> str | None:
    """A tensor name as stored: with or without the `bert.` prefix of BertFor* checkpoints."""
    for cand in (name, f"bert.{name}"):
        if cand in stored:
            return cand
    return None


def load_bert(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> BertModel:
    """The BertModel of a Hugging Face directory (config.json + model.safetensors), loaded strictly."""
    d = Path(model_dir)
    cfg = BertConfig.load(d)
    path = d / "model.safetensors"
    if not path.is_file():
        raise ValueError(f"{d} has no model.safetensors; point --encoder-model at a sentence-transformers model "
                         "directory with safetensors weights")
    model = BertModel(cfg)
    mapping = {n: n for n, _ in model.named_parameters() if not n.startswith("layers.")}
    for i in range(cfg.num_layers):
        mapping.update(_weight_names(i))
    params = dict(model.named_parameters())
    with safe_open(str(path), framework="pt") as f:
        stored = set(f.keys())
        missing, bad = [], []
        used: set[str] = set()
        with torch.no_grad():
            for ours, hf in mapping.items():
                name = _checkpoint_name(hf, stored)
                if name is None:
                    missing.append(hf)
                    continue
                t = f.get_tensor(name)
                if t.shape != params[ours].shape:
                    bad.append(f"{name} {tuple(t.shape)} != {tuple(params[ours].shape)}")
                    continue
                params[ours].copy_(t)
                used.add(name)
    # Buffers and heads a BertModel does not use (position_ids, the pooler, MLM/NSP heads) may be stored too.
    unexpected = sorted(n for n in stored - used if not n.endswith("position_ids") and ".pooler." not in f".{n}"
                        and not n.startswith(("cls.", "pooler.")))
    if missing or bad or unexpected:
        parts = [f"missing: {', '.join(missing[:6])}" if missing else "",
                 f"wrong shape: {', '.join(bad[:6])}" if bad else "",
                 f"unexpected: {', '.join(unexpected[:6])}" if unexpected else ""]
        raise ValueError(f"{path} does not match a BERT model of its config.json ({'; '.join(p for p in parts if p)})")
    return model.to(dtype).eval()
