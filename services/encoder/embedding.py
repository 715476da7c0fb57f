"""A sentence-embedding model: tokenizer + BERT encoder + pooling (+ L2 normalization), as sentence-transformers
runs a directory such as all-MiniLM-L6-v2 (modules.json: Transformer -> Pooling -> Normalize).

`tokenize` turns texts into token ids (the model's special tokens added) and refuses, or cuts when asked, inputs
longer than the model's max sequence length (sentence_bert_config.json). `embed` runs one padded batch of token
id lists through the model and returns float32 vectors. Both are plain, synchronous calls: the batcher runs
`embed` on its compute thread and groups requests of similar length into one forward.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from proto.pdrelay.v1 import common_pb2
from services.encoder.errors import EncoderError
from services.encoder.pooling import Pooling, pool
from shared.engine.models.bert import BertModel, PackedBatch, load_bert

_ST_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class EmbeddingSpec:
    """What an embedding model is, as clients and the gateway see it."""

    name: str  # served model name
    dim: int
    max_seq_len: int  # tokens per input, special tokens included
    vocab_size: int
    normalized: bool  # the model's pipeline L2-normalizes its output
    matryoshka_dims: tuple[int, ...] = ()  # smaller `dimensions` the model was trained for (empty: none)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


class SentenceEmbedder:
    """One embedding model, loaded from a sentence-transformers (or plain BERT) Hugging Face directory."""

    def __init__(
        self, model_dir: str | Path, name: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> None:
        d = Path(model_dir)
        self.device = torch.device(device)
        self.model: BertModel = load_bert(d, dtype, device=self.device)
        cfg = self.model.cfg
        self.pooling = Pooling.of_dir(d)
        modules = json.loads((d / "modules.json").read_text()) if (d / "modules.json").is_file() else []
        normalized = any(m.get("type") == _ST_NORMALIZE for m in modules)
        st = _read_json(d / "sentence_bert_config.json")
        max_len = int(st.get("max_seq_length") or cfg.max_position_embeddings)
        max_len = min(max_len, cfg.max_position_embeddings)
        dims = _read_json(d / "config_sentence_transformers.json").get("matryoshka_dims") or ()
        self.spec = EmbeddingSpec(
            name=name,
            dim=cfg.hidden_size,
            max_seq_len=max_len,
            vocab_size=cfg.vocab_size,
            normalized=normalized,
            matryoshka_dims=tuple(sorted(int(x) for x in dims if 0 < int(x) < cfg.hidden_size)),
        )
        tok_path = d / "tokenizer.json"
        if not tok_path.is_file():
            raise ValueError(f"{d} has no tokenizer.json; the encoder needs a fast (tokenizers) tokenizer")
        self.tokenizer = Tokenizer.from_file(str(tok_path))
        # The file may carry the padding / truncation its exporter used (all-MiniLM's pads to 128): ours is done
        # per batch, and truncation only when a request asks for it.
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self._specials = self.tokenizer.num_special_tokens_to_add(False)  # [CLS] + [SEP] for BERT
        self.dtype = dtype

    # ---- input ------------------------------------------------------------------------------------------------
    def truncation_limit(self, truncate_prompt_tokens: int) -> int:
        """Tokens kept per input: 0 -> no cutting (over-long inputs are refused); N -> N, at most the model's."""
        limit = self.spec.max_seq_len
        if truncate_prompt_tokens > limit:
            raise EncoderError(
                common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                f"truncate_prompt_tokens {truncate_prompt_tokens} is more than {self.spec.name}'s max "
                f"sequence length of {limit} tokens; use at most {limit} (or -1 for the max)",
            )
        if 0 < truncate_prompt_tokens <= self._specials:
            raise EncoderError(
                common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                f"truncate_prompt_tokens {truncate_prompt_tokens} leaves no room for text next to the "
                f"model's {self._specials} special tokens; use at least {self._specials + 1}",
            )
        return truncate_prompt_tokens

    def tokenize(self, texts: Sequence[str], truncate_to: int = 0) -> list[list[int]]:
        """Token ids of each text with the model's special tokens; cut to `truncate_to` tokens (specials kept, as
        Hugging Face tokenizers cut: the end of the text goes) when > 0, else over-long texts are refused."""
        if not truncate_to:
            ids = [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=True)]
        else:
            ids = []
            for enc in self.tokenizer.encode_batch(list(texts), add_special_tokens=False):
                enc.truncate(truncate_to - self._specials)
                ids.append(self.tokenizer.post_process(enc).ids)
        self._check_lengths(ids, "input")
        return ids

    def check_token_inputs(self, inputs: Sequence[Sequence[int]], truncate_to: int = 0) -> list[list[int]]:
        """Pre-tokenized inputs, used as they are (their first `truncate_to` tokens when > 0)."""
        V = self.spec.vocab_size
        out: list[list[int]] = []
        for i, ids in enumerate(inputs):
            if not ids:
                raise EncoderError(common_pb2.ERROR_CODE_INVALID_ARGUMENT, f"input[{i}] is an empty list of token ids")
            bad = next((t for t in ids if t >= V), None)
            if bad is not None:
                raise EncoderError(
                    common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                    f"input[{i}] has token id {bad}, outside the vocabulary of {self.spec.name} (0..{V - 1})",
                )
            out.append(list(ids[:truncate_to]) if truncate_to else list(ids))
        self._check_lengths(out, "input")
        return out

    def _check_lengths(self, ids: Sequence[Sequence[int]], what: str) -> None:
        limit = self.spec.max_seq_len
        for i, seq in enumerate(ids):
            if len(seq) > limit:
                raise EncoderError(
                    common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                    f"{what}[{i}] is {len(seq)} tokens, but {self.spec.name} takes at most {limit} "
                    f"tokens per input; shorten it, or set truncate_prompt_tokens (-1: cut to the max)",
                )

    def check_dimensions(self, dimensions: int) -> int:
        """The output size a request asks for (0: the model's); others are refused unless trained for them."""
        spec = self.spec
        if dimensions in (0, spec.dim):
            return spec.dim
        if dimensions in spec.matryoshka_dims:
            return dimensions
        allowed = ", ".join(str(d) for d in (*spec.matryoshka_dims, spec.dim))
        raise EncoderError(
            common_pb2.ERROR_CODE_INVALID_ARGUMENT,
            f"dimensions {dimensions} is not supported by {spec.name}: it makes {allowed}-dimensional "
            "embeddings only" + ("" if spec.matryoshka_dims else " (it is not a Matryoshka model)"),
        )

    # ---- compute ------------------------------------------------------------------------------------------------
    def embed(self, batch: Sequence[Sequence[int]]) -> torch.Tensor:
        """token id lists -> [len(batch), dim] float32, pooled and (as the model's pipeline says) normalized.
        One forward over the batch, packed (no padding in the dense layers)."""
        packed = PackedBatch.of(batch, self.dtype, self.device)
        with torch.inference_mode():
            hidden = self.model(packed)
            out = pool(hidden, packed, self.pooling)
            if self.spec.normalized:
                out = F.normalize(out, p=2, dim=1)
        return out.float().cpu()


def finish(vectors: torch.Tensor, dimensions: int, normalize: bool, model_normalized: bool) -> torch.Tensor:
    """Per request, after the shared forward: cut to `dimensions` (Matryoshka) and L2-normalize when the request
    or the model asks (a cut vector is normalized again, as sentence-transformers' truncate_dim + normalize)."""
    if dimensions < vectors.shape[1]:
        vectors = vectors[:, :dimensions]
        if model_normalized or normalize:
            return F.normalize(vectors, p=2, dim=1)
    if normalize and not model_normalized:
        return F.normalize(vectors, p=2, dim=1)
    return vectors
