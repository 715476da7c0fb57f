"""ModelRunner: loads a model and its KV pool, and runs one forward per SchedulerOutput.

The runner knows nothing about sampling or scheduling: `forward` turns a SchedulerOutput into a ForwardBatch,
runs the model (writing the scheduled tokens' K/V into the pages given, reading prefixes from them) and returns
float32 logits for the sequences that asked for them. A prefill-only worker uses it the same way.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from shared.config.quantization import QuantSpec, parse_quantization
from shared.engine.cuda_graph import CudaGraphDecodeRunner, build_decode_graphs
from shared.engine.forward_batch import ForwardBatch, build_forward_batch
from shared.engine.kv_pool import KVPool, num_pages_for_budget, torch_dtype
from shared.engine.kv_scales import read_kv_scales
from shared.engine.models import LlamaForCausalLM, build_model, load_model_config
from shared.engine.models.config import GEMMA_TYPES, ModelArchConfig
from shared.engine.models.llama import DecoderLayer
from shared.engine.models.llava import LlavaWeights, canonical_name, load_llava_config
from shared.engine.models.mla_config import MLA_TYPES
from shared.engine.runner import OwnPool
from shared.engine.types import SchedulerOutput
from shared.engine.weights import checkpoint_files, load_weights
from shared.kernels.dequant_linear import DequantLinear
from shared.kernels.dispatch import select_attention_backend
from shared.kernels.elementwise import elementwise_ops
from shared.kernels.linear import select_linear_backend
from shared.modelspec.kv_layout import KVLayout

if TYPE_CHECKING:
    from shared.engine.models import ModelArchConfig, WeightSlot
    from shared.engine.models.tp_hooks import TPComm

# When neither num_pages nor kv_budget_bytes is given: enough for a few full batches, small enough for a laptop.
DEFAULT_KV_BUDGET_BYTES = 512 * 1024 * 1024


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def kv_attention_backend(name: str, kv_dtype: str, dtype: str) -> str:
    """The attention backend over KV pages of another dtype than the model's (fp8, or bf16 under an fp32 model):
    torch, whose ops widen what they gather (auto or torch asked for); ValueError for the others, whose kernels (and
    the native fused decode) read pages of the model's dtype."""
    if name not in ("auto", "torch"):
        raise ValueError(
            f"attention_backend {name!r} reads KV pages of the model's dtype ({dtype}), not {kv_dtype}; "
            "use --attention-backend torch"
        )
    return "torch"


def mla_options(arch: ModelArchConfig, attention_backend: str, kv_dtype: str, quantization: str | None) -> str:
    """The attention backend of an MLA (DeepSeek) model: its attention over the latent cache runs on the torch ops
    (shared/kernels/mla_attention.py), so auto means torch and the others are refused, as are what it cannot hold
    yet: fp8 latent pages and quantized weights."""
    if attention_backend not in ("auto", "torch"):
        raise ValueError(
            f"--attention-backend {attention_backend}: {arch.architecture} attends over its latent KV cache with the "
            "torch ops only for now; use --attention-backend torch (or auto)"
        )
    if kv_dtype == "fp8_e4m3":
        raise ValueError(f"--kv-cache-dtype fp8_e4m3: {arch.architecture}'s latent KV pages are not quantized yet")
    if quantization is not None:
        raise ValueError(f"--quantization {quantization}: {arch.architecture} loads unquantized weights only for now")
    return "torch"


class ModelShard(Protocol):
    """One rank's part of a tensor-parallel model (shared/engine/parallel/shard.py implements it): a protocol
    here so the runner never imports the parallel package, which imports the runner."""

    @property
    def size(self) -> int:
        """Ranks in the group."""
        ...

    @property
    def comm(self) -> TPComm:
        """This rank's collectives."""
        ...

    def local_arch(self, arch: ModelArchConfig) -> ModelArchConfig:
        """The config this rank's model is built from (its heads, KV heads, intermediate size, vocab rows)."""
        ...

    def weight_map(self, full: dict[str, WeightSlot]) -> dict[str, WeightSlot]:
        """The model's weight map with the slice of each checkpoint tensor this rank reads."""
        ...

    def prepare(self, model: LlamaForCausalLM) -> None:
        """Before loading (padding rows)."""
        ...

    def finish(self, model: LlamaForCausalLM) -> None:
        """After loading (biases only one rank adds)."""
        ...


def arch_tp_problem(arch: ModelArchConfig, tp: int) -> str | None:
    """Why tensor parallelism cannot split this architecture yet (None: it can); checked before ranks start."""
    # Gemma's extra norms, Phi-3's fused checkpoint tensors, DeepSeek's latent attention (heads not sliced yet)
    if arch.model_type in (*GEMMA_TYPES, "phi3", *MLA_TYPES):
        return f"--tp-size {tp}: {arch.architecture} runs at --tp-size 1 only for now"
    if arch.num_experts:  # the stacked experts are not split per rank (neither TP within them nor expert parallel)
        return f"--tp-size {tp}: mixture-of-experts models ({arch.architecture}) run at --tp-size 1 only for now"
    return None


def _check_shardable(
    tp: int, model_dir: Path, device: torch.device, cuda_graph_bs: Sequence[int], arch: ModelArchConfig, quantized: bool
) -> None:
    """ValueError for what tensor parallelism does not cover yet."""
    problem = arch_tp_problem(arch, tp)
    if problem is not None:
        raise ValueError(problem)
    if quantized:  # the block scales are not sliced per rank
        raise ValueError(f"--tp-size {tp}: quantized weights (--quantization) run at --tp-size 1 only for now")
    if load_llava_config(model_dir) is not None:
        raise ValueError(f"--tp-size {tp}: vision-language models run at --tp-size 1 only for now")
    if device.type == "cuda" and cuda_graph_bs:
        raise ValueError(f"--tp-size {tp}: CUDA graphs are not captured at tp > 1 yet; add --disable-cuda-graph")


class ModelRunner(OwnPool):
    """One model + one KV pool on one device.

    Attributes: layout (KVLayout), kv (KVPool), num_pages, vocab_size, hf_config (transformers config, lazy),
    arch (our parsed config), attn and linear (the kernel backends), eos_token_ids, context_length, page_size, device, dtype, model, graphs (the
    CUDA-graph decode runner, or None: on CPU, without cuda_graph_bs, or with a backend that cannot be captured).
    """

    can_copy_pages = True  # its KVPool copies pages (n > 1 forks)

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        kv_cache_dtype: str | None = None,
        quantization: str | None = None,
        device: str = "cpu",
        num_pages: int | None = None,
        kv_budget_bytes: int | None = None,
        page_size: int = 16,
        attention_backend: str = "auto",
        linear_backend: str = "auto",
        max_batch_tokens: int = 4096,
        context_length: int | None = None,
        cuda_graph_bs: Sequence[int] = (),
        shard: ModelShard | None = None,
    ) -> None:
        """shard: this process is one rank of a tensor-parallel group (shared/engine/parallel): it builds and
        loads only its part of the model, and its KV pool holds only its KV heads."""
        model_dir = Path(model_dir)
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two (got {page_size}); try 16")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1 (got {max_batch_tokens})")
        self.model_dir = model_dir
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # the process's GPU (set at its start)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = torch_dtype(dtype)
        self.arch = load_model_config(model_dir)
        self.quant = parse_quantization(_read_json(model_dir / "config.json"))  # None: unquantized weights
        if quantization is not None and self.arch.num_experts:  # the experts' stacked weights are not quantized
            raise ValueError(
                f"--quantization {quantization}: mixture-of-experts models ({self.arch.architecture}) run "
                "unquantized only for now"
            )
        self.vocab_size = self.arch.vocab_size
        self.context_length = context_length or self.arch.max_position_embeddings
        self.page_size = page_size
        self.max_batch_tokens = max_batch_tokens
        self.eos_token_ids = self._eos_ids(model_dir)

        kv_dtype = kv_cache_dtype or dtype  # None: the model's dtype
        if kv_dtype != dtype:  # fp8, or bf16 under fp32: the torch ops widen the pages; no (Triton) decode graphs
            attention_backend, cuda_graph_bs = kv_attention_backend(attention_backend, kv_dtype, dtype), ()
        if self.arch.mla is not None:
            attention_backend = mla_options(self.arch, attention_backend, kv_dtype, quantization)
        self.shard = shard
        if shard is not None:  # before local_arch, which assumes a shape it can slice
            quantized = self.quant is not None or quantization is not None
            _check_shardable(shard.size, model_dir, self.device, cuda_graph_bs, self.arch, quantized)
        arch = self.arch if shard is None else shard.local_arch(self.arch)
        self._build_model(arch, attention_backend, linear_backend, quantization)
        self._build_kv(arch, kv_dtype, num_pages, kv_budget_bytes, cuda_graph_bs)

    def _build_model(
        self, arch: ModelArchConfig, attention_backend: str, linear_backend: str, quantization: str | None
    ) -> None:
        """self.attn, self.model (loaded, on its device) and self.linear; `arch` is this rank's config."""
        # The attention backend decides the other kernels too: Triton attention comes with Triton norms/rotary/act.
        self.attn = select_attention_backend(attention_backend, self.device, self.dtype)
        # Built on its device: each checkpoint tensor is copied there as it is read (weights.py), no host copy.
        self.model: LlamaForCausalLM = build_model(
            arch,
            self.dtype,
            max_positions=self.context_length,
            ops=elementwise_ops(self.attn.name),
            device=self.device if self.device.type != "cpu" else None,
            quant=self.quant,
            tp=None if self.shard is None else self.shard.comm,
        )
        self.llava = load_llava_config(self.model_dir)  # None: a text-only model
        self._load_weights(self.model_dir)
        self.model.post_load()
        self._quantize_online(quantization)
        self.model.eval()
        self.model.to_device(self.device)
        self.linear = select_linear_backend(linear_backend, self.device, self.dtype)
        # quantized projections dequantized per call, the lm_head on the backend chosen
        self.linear = DequantLinear(self.linear) if self.quant is not None else self.linear
        self.model.use_linear(self.linear)

    def _build_kv(
        self,
        arch: ModelArchConfig,
        kv_dtype: str,
        num_pages: int | None,
        kv_budget_bytes: int | None,
        cuda_graph_bs: Sequence[int],
    ) -> None:
        """self.layout, self.num_pages, self.kv and self.graphs (decode CUDA graphs, cuda only)."""
        page_size = self.page_size
        self.layout = KVLayout(
            dtype=kv_dtype,
            page_size=page_size,
            num_layers=self.arch.num_layers,
            num_kv_heads=arch.num_kv_heads,  # this rank's under tensor parallelism
            head_dim=self.arch.head_dim,
            kind="mla" if self.arch.mla is not None else "mha",  # mla: one latent row per token (kv_layout.py)
        )
        if num_pages is None:
            num_pages = num_pages_for_budget(self.layout, kv_budget_bytes or DEFAULT_KV_BUDGET_BYTES)
        elif kv_budget_bytes is not None:
            raise ValueError("give num_pages or kv_budget_bytes, not both")
        self.num_pages = num_pages
        # Decode CUDA graphs (cuda only) pad a batch with rows whose K/V go to one extra page past the num_pages
        # the scheduler hands out.
        want_graphs = self.device.type == "cuda" and bool(cuda_graph_bs) and not self.arch.host_planned_attention
        self.kv = self._make_pool(num_pages + int(want_graphs))
        self.graphs: CudaGraphDecodeRunner | None = None
        if want_graphs:
            self.graphs = build_decode_graphs(
                self.model,
                self.kv,
                self.attn,
                batch_sizes=cuda_graph_bs,
                context_length=self.context_length,
                page_size=page_size,
                scratch_page=num_pages,
            )

    def _load_weights(self, model_dir: Path) -> None:
        """The checkpoint into self.model: this rank's slice of each tensor under tensor parallelism, the decoder
        half of a vision-language checkpoint (its tower runs in a VisionEncoderRunner), or the whole model."""
        tied = self.arch.tie_word_embeddings
        if self.shard is not None:
            self.shard.prepare(self.model)
            load_weights(self.model, self.shard.weight_map(self.model.hf_weight_map()), model_dir, tied_lm_head=tied)
            self.shard.finish(self.model)
        elif self.llava is None:
            load_weights(self.model, self.model.hf_weight_map(), model_dir, tied_lm_head=tied)
        else:
            text = LlavaWeights(self.model, None)
            load_weights(
                text,
                text.hf_weight_map(),
                model_dir,
                rename=canonical_name,
                skip_prefixes=text.skipped_prefixes(self.arch),
            )

    def _make_pool(self, num_pages: int) -> KVPool:
        """The KV pool of self.layout, with the checkpoint's k/v scales when its pages are fp8, populating."""
        kv = KVPool(self.layout, num_pages, self.device)
        if kv.quantized:
            scales = read_kv_scales(checkpoint_files(self.model_dir), self.arch.num_layers)
            if scales is not None:
                kv.set_scales(*scales)
        kv.populate_in_background()  # host pools: fault the pool in now, not in the first steps that write it
        return kv

    def _quantize_online(self, method: str | None) -> None:
        """--quantization: a checkpoint quantized with it is served as it is; fp8 also quantizes an unquantized one
        here, after loading (128 x 128 blocks, like the FP8 checkpoints); any other mismatch is refused."""
        if method is None:
            return
        if self.quant is not None:
            if not self.quant.named_by(method):
                raise ValueError(f"--quantization {method}: the checkpoint is quantized with {self.quant.method!r}")
            return
        if method != "fp8":
            raise ValueError(f"--quantization {method}: only fp8 quantizes an unquantized checkpoint at load")

        self.quant = QuantSpec("fp8", (128, 128))
        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)
            layer.quantize_fp8(self.quant)
        self.model.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())

    @functools.cached_property
    def hf_config(self) -> Any:
        """The transformers config of the model, loaded on first use: importing transformers takes seconds and
        the runner itself only needs `arch` (a prefill or decode worker without a tokenizer never pays it)."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(self.model_dir), local_files_only=True)

    def _eos_ids(self, model_dir: Path) -> tuple[int, ...]:
        """config.json's eos ids, plus generation_config.json's (chat models often list <|im_end|> there)."""
        ids = list(self.arch.eos_token_ids)
        gen = _read_json(model_dir / "generation_config.json").get("eos_token_id")
        for i in [gen] if isinstance(gen, int) else gen or []:
            if int(i) not in ids:
                ids.append(int(i))
        return tuple(ids)

    def prepare(self, out: SchedulerOutput) -> ForwardBatch:
        """SchedulerOutput -> ForwardBatch (validated against the pool, vocabulary and context length)."""
        if out.num_tokens > self.max_batch_tokens:
            raise ValueError(
                f"step has {out.num_tokens} tokens, more than max_batch_tokens {self.max_batch_tokens}; "
                f"schedule fewer tokens per step (chunked prefill) or raise max_batch_tokens"
            )
        return build_forward_batch(
            out,
            self.page_size,
            self.device,
            num_pages=self.num_pages,
            vocab_size=self.vocab_size,
            max_positions=self.context_length,
        )

    @torch.inference_mode()
    def forward(self, out: SchedulerOutput) -> torch.Tensor:
        """Run one step. Returns float32 logits [n, vocab] for the seqs with need_logits, in out.seqs order."""
        if not out.seqs:
            return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self.device)
        batch = self.prepare(out)
        return self.forward_batch(batch)

    @torch.inference_mode()
    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        """forward() for an already prepared batch (benchmarks time preparation and compute apart)."""
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        meta = self.attn.prepare(
            batch.page_table, batch.prefix_lens, batch.extend_lens, batch.token_starts, self.page_size
        )
        hidden = self.model(batch, self.kv, self.attn, meta)  # [n, hidden]
        return self.model.compute_logits(hidden)
