"""Per-request sampling parameters (OpenAI/vLLM names and defaults), frozen and validated: one type from the front
doors (the gateway plans them) over the wire (shared/cluster/sampling_pb.py) to the engine's sampler."""

from __future__ import annotations

from dataclasses import dataclass

from shared.grammar.spec import StructuredSpec
from shared.modelspec.errors import InvalidRequest

MAX_LOGPROBS = 20  # the OpenAI API's limit on top alternatives per token
MAX_N = 64  # samples per prompt (n)
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values
_GREEDY_EPS = 1e-5  # temperatures below this are treated as greedy (dividing by them overflows)


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    max_tokens None: until the context is full. temperature 0: greedy. top_k -1: off. logprobs None: no
    logprobs; n >= 0: the chosen token's logprob plus the n most likely alternatives. Penalties follow OpenAI
    (frequency/presence over generated tokens) and HF/vLLM (repetition over prompt and generated tokens).
    """

    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    n: int = 1
    # (token id, bias) added to the logits before sampling (OpenAI logit_bias); logprobs stay those of the model
    logit_bias: tuple[tuple[int, float], ...] = ()
    structured: StructuredSpec | None = None  # the output must match this grammar (structured outputs)
    # logprobs of prompt tokens 1.. with this many alternatives (echo + logprobs); such a request skips the prefix
    # cache for its prompt, since cached positions have no logits
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        # Accept lists (JSON arrays) and a bare string for `stop`, store tuples so the object stays hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not isinstance(self.logit_bias, tuple):
            items = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
            object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in items))

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def validate(self, *, vocab_size: int | None = None) -> SamplingParams:
        """Raise InvalidRequest naming the first bad value and how to fix it; returns self for chaining."""

        def bad(field: str, msg: str) -> InvalidRequest:
            return InvalidRequest(f"{field}: {msg}", field=field)

        if not 1 <= self.n <= MAX_N:
            raise bad("n", f"must be in [1, {MAX_N}] (got {self.n})")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise bad(
                "max_tokens", f"must be >= 1 (got {self.max_tokens}); omit it to generate until the context is full"
            )
        if self.min_tokens < 0:
            raise bad("min_tokens", f"must be >= 0 (got {self.min_tokens})")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must be <= max_tokens (got {self.min_tokens} > {self.max_tokens})")
        if not self.temperature >= 0.0:  # also rejects NaN
            raise bad("temperature", f"must be >= 0 (got {self.temperature}); use 0 for greedy decoding")
        if self.temperature > 100.0:
            raise bad("temperature", f"must be <= 100 (got {self.temperature})")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1] (got {self.top_p}); use 1 to disable")
        if self.top_k == 0 or self.top_k < -1:
            raise bad("top_k", f"must be -1 (disabled) or >= 1 (got {self.top_k})")
        if vocab_size is not None and self.top_k > vocab_size:
            raise bad("top_k", f"must be <= the vocabulary size {vocab_size} (got {self.top_k}); use -1 to disable")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1] (got {self.min_p}); use 0 to disable")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise bad("repetition_penalty", f"must be in (0, 10] (got {self.repetition_penalty}); use 1 to disable")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if not -2.0 <= v <= 2.0:
                raise bad(name, f"must be in [-2, 2] (got {v}); use 0 to disable")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise bad("seed", f"must be in [0, 2**63) (got {self.seed})")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", f"stop strings must be non-empty strings (got {self.stop!r})")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0 or (vocab_size is not None and t >= vocab_size):
                raise bad("stop_token_ids", f"token id {t!r} is not in [0, {vocab_size or '2**31'})")
        for t, b in self.logit_bias:
            if t < 0 or (vocab_size is not None and t >= vocab_size):
                raise bad("logit_bias", f"token id {t} is not in [0, {vocab_size or '2**31'})")
            if not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
                raise bad("logit_bias", f"bias of token {t} must be in [-100, 100] (got {b})")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise bad("logprobs", f"must be in [0, {MAX_LOGPROBS}] (got {self.logprobs})")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise bad("prompt_logprobs", f"must be in [0, {MAX_LOGPROBS}] (got {self.prompt_logprobs})")
        return self
