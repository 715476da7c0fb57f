"""BERT-family encoder (BertModel: embeddings + post-LayerNorm transformer layers), for sentence embeddings.

The layout and names follow Hugging Face's `BertModel` so a checkpoint loads tensor for tensor (strictly: a
missing, unexpected or wrongly shaped tensor is an error). Only what embedding models use is here: absolute
position embeddings, token type 0, bidirectional attention, no pooler head (sentence pooling is the caller's:
mean over the tokens, as sentence-transformers does).

A batch is packed (PackedBatch): the sequences end to end, so the dense layers (nearly all the FLOPs) compute no
padding at all, whatever the mix of lengths; only attention scatters the tokens into a padded [B, T] grid.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from shared.kernels.linear import LinearBackend, PackedWeight, TorchLinear, select_linear_backend

_ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


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
    def from_dict(cls, d: dict, where: str = "config.json") -> BertConfig:
        if d.get("model_type") != "bert":
            raise ValueError(
                f"{where}: model_type {d.get('model_type')!r} is not 'bert'; the encoder serves "
                "BERT-family embedding models (e.g. bundled:all-minilm-l6-v2)"
            )
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"{where}: position_embedding_type {d['position_embedding_type']!r} is not supported (only 'absolute')"
            )
        act = d.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"{where}: hidden_act {act!r} is not supported; known: {', '.join(_ACTIVATIONS)}")
        cfg = cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=d["num_attention_heads"],
            intermediate_size=d["intermediate_size"],
            max_position_embeddings=d["max_position_embeddings"],
            type_vocab_size=d.get("type_vocab_size", 2),
            layer_norm_eps=d.get("layer_norm_eps", 1e-12),
            hidden_act=act,
            pad_token_id=d.get("pad_token_id") or 0,
        )
        if cfg.hidden_size % cfg.num_heads:
            raise ValueError(
                f"{where}: hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads {cfg.num_heads}"
            )
        return cfg

    @classmethod
    def load(cls, model_dir: str | Path) -> BertConfig:
        path = Path(model_dir) / "config.json"
        return cls.from_dict(json.loads(path.read_text()), str(path))


@dataclass(frozen=True)
class PackedBatch:
    """Sequences laid end to end, no padding: every dense layer runs over exactly the real tokens. Attention alone
    needs the [B, T] grid: `grid_index` places each token in it (row-major), `mask` hides the padded keys."""

    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] position of each token in its sequence
    seq_ids: torch.Tensor  # [N] which sequence each token belongs to
    lengths: torch.Tensor  # [B]
    grid_index: torch.Tensor  # [N] index into the flattened [B, T] grid
    batch_size: int
    max_len: int
    mask: torch.Tensor | None  # [B, 1, 1, T] additive (0 keep, dtype min drop); None when no sequence is padded

    @classmethod
    def of(
        cls, seqs: Sequence[Sequence[int]], dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> PackedBatch:
        B = len(seqs)
        lens = [len(s) for s in seqs]
        T = max(lens)
        ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
        lengths = torch.tensor(lens, dtype=torch.long)
        seq_ids = torch.repeat_interleave(torch.arange(B), lengths)
        starts = torch.cumsum(lengths, 0) - lengths
        positions = torch.arange(ids.numel()) - torch.repeat_interleave(starts, lengths)
        mask = None
        if min(lens) != T:
            keep = positions.new_zeros((B, T), dtype=torch.bool)
            keep.view(-1)[seq_ids * T + positions] = True
            mask = (
                torch.zeros((B, 1, 1, T), dtype=dtype)
                .masked_fill(~keep[:, None, None, :], torch.finfo(dtype).min)
                .to(device)
            )
        return cls(
            ids.to(device),
            positions.to(device),
            seq_ids.to(device),
            lengths.to(device),
            (seq_ids * T + positions).to(device),
            B,
            T,
            mask,
        )


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        # -> [N, H]; every token has token type 0 (single-sentence inputs)
        x = self.word_embeddings(batch.input_ids) + self.position_embeddings(batch.positions)
        return self.LayerNorm(x + self.token_type_embeddings.weight[0])


class BertLayer(nn.Module):
    """Self-attention and MLP, each followed by residual + LayerNorm (post-norm, as BERT)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        H, inner = cfg.hidden_size, cfg.intermediate_size
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.attn_out = nn.Linear(H, H)
        self.attn_norm = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(H, inner)
        self.out = nn.Linear(inner, H)
        self.out_norm = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.linear: LinearBackend = TorchLinear()
        self._packed: dict[str, tuple[PackedWeight, torch.Tensor]] = {}

    def prepare(self, linear: LinearBackend) -> None:
        """After loading: Q, K and V as one projection (one GEMM, not three), weights packed for `linear`."""
        self.linear = linear
        qkv_w = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        qkv_b = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        self._packed = {"qkv": (linear.pack(qkv_w), qkv_b)}
        for name in ("attn_out", "intermediate", "out"):
            m = getattr(self, name)
            self._packed[name] = (linear.pack(m.weight), m.bias)

    def _proj(self, name: str, x: torch.Tensor) -> torch.Tensor:
        w, b = self._packed[name]
        return self.linear.apply(x, w, b)

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        # x: [N, H] packed tokens
        H = x.shape[1]
        B, T, nh, hd = batch.batch_size, batch.max_len, self.num_heads, self.head_dim
        qkv = self._proj("qkv", x)  # [N, 3H]
        if batch.mask is not None or B > 1:
            grid = qkv.new_zeros((B * T, 3 * H))
            grid[batch.grid_index] = qkv
            qkv = grid
        q, k, v = qkv.view(B, T, 3, nh, hd).permute(2, 0, 3, 1, 4)  # each [B, heads, T, head_dim]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=batch.mask, scale=1.0 / math.sqrt(hd))
        a = a.transpose(1, 2).reshape(B * T, H)
        if B > 1:
            a = a[batch.grid_index]
        x = self.attn_norm(self._proj("attn_out", a) + x)
        return self.out_norm(self._proj("out", self.act(self._proj("intermediate", x))) + x)


class BertModel(nn.Module):
    """A packed batch of token id sequences -> [N, hidden] last hidden states of every token."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))

    def prepare(self, linear: LinearBackend) -> BertModel:
        for layer in self.layers:
            layer.prepare(linear)  # type: ignore[operator]  # nn.ModuleList types its items as Module
        return self

    @torch.inference_mode()
    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.embeddings(batch)
        for layer in self.layers:
            x = layer(x, batch)
        return x


def _weight_names(i: int) -> dict[str, str]:
    """Our parameter names of layer i -> Hugging Face's."""
    hf = f"encoder.layer.{i}."
    ours = f"layers.{i}."
    pairs = {
        "query": "attention.self.query",
        "key": "attention.self.key",
        "value": "attention.self.value",
        "attn_out": "attention.output.dense",
        "attn_norm": "attention.output.LayerNorm",
        "intermediate": "intermediate.dense",
        "out": "output.dense",
        "out_norm": "output.LayerNorm",
    }
    return {f"{ours}{o}.{p}": f"{hf}{h}.{p}" for o, h in pairs.items() for p in ("weight", "bias")}


def _checkpoint_name(name: str, stored: set[str]) -> str | None:
    """A tensor name as stored: with or without the `bert.` prefix of BertFor* checkpoints."""
    for cand in (name, f"bert.{name}"):
        if cand in stored:
            return cand
    return None


def load_bert(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    linear: LinearBackend | None = None,
    device: torch.device | str = "cpu",
) -> BertModel:
    """The BertModel of a Hugging Face directory (config.json + model.safetensors), loaded strictly, its dense
    projections on `linear` (default: oneDNN over prepacked weights for fp32 on CPU, else F.linear)."""
    d = Path(model_dir)
    cfg = BertConfig.load(d)
    path = d / "model.safetensors"
    if not path.is_file():
        raise ValueError(
            f"{d} has no model.safetensors; point --encoder-model at a sentence-transformers model "
            "directory with safetensors weights"
        )
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
    unexpected = sorted(
        n
        for n in stored - used
        if not n.endswith("position_ids") and ".pooler." not in f".{n}" and not n.startswith(("cls.", "pooler."))
    )
    if missing or bad or unexpected:
        parts = [
            f"missing: {', '.join(missing[:6])}" if missing else "",
            f"wrong shape: {', '.join(bad[:6])}" if bad else "",
            f"unexpected: {', '.join(unexpected[:6])}" if unexpected else "",
        ]
        raise ValueError(f"{path} does not match a BERT model of its config.json ({'; '.join(p for p in parts if p)})")
    model = model.to(device=device, dtype=dtype).eval()
    return model.prepare(linear or select_linear_backend("auto", device, dtype))
