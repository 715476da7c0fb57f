"""RoPE: the cos/sin cache and the neox rotation against complex-number rotation; Llama-3 and YaRN scaling against
HF."""

from __future__ import annotations

import math

import pytest
import torch

from shared.kernels.rope_scaling import yarn
from shared.kernels.rotary import RotaryCache, apply_rotary, rope_inv_freq


def test_apply_rotary_is_a_complex_rotation() -> None:
    g = torch.Generator().manual_seed(0)
    t, heads, d, base = 11, 3, 16, 10000.0
    x = torch.randn(t, heads, d, generator=g)
    positions = torch.randint(0, 300, (t,), generator=g)
    cache = RotaryCache(d, 512, base)
    cos, sin = cache.lookup(positions, torch.float32)
    out = apply_rotary(x, cos, sin)
    assert out.shape == x.shape and not out.isnan().any()
    # independent reference: pair (x[i], x[i + d/2]) is a complex number rotated by angle pos * base^(-2i/d)
    freqs = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    angle = positions.double()[:, None] * freqs[None, :]  # [T, d/2]
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double()) * torch.polar(
        torch.ones_like(angle), angle
    ).unsqueeze(1)
    ref = torch.cat((z.real, z.imag), dim=-1)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


def test_rotation_preserves_norm_and_position_zero_is_identity() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 2, 8, generator=g)
    cache = RotaryCache(8, 64, 500.0)
    cos, sin = cache.lookup(torch.tensor([0, 1, 30, 63]), torch.float32)
    out = apply_rotary(x, cos, sin)
    torch.testing.assert_close(out[0], x[0])
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


def test_llama3_scaling_matches_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    }
    cfg = LlamaConfig(
        hidden_size=512, num_attention_heads=8, head_dim=64, max_position_embeddings=131072, rope_parameters=params
    )
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    mine = rope_inv_freq(64, 500000.0, params)
    assert not torch.equal(mine, rope_inv_freq(64, 500000.0))  # scaling really changed something
    torch.testing.assert_close(mine, ref.float(), rtol=1e-6, atol=0)


def test_linear_scaling_divides_frequencies() -> None:
    plain = rope_inv_freq(32, 10000.0)
    torch.testing.assert_close(rope_inv_freq(32, 10000.0, {"rope_type": "linear", "factor": 4.0}), plain / 4)
    assert math.isclose(float(plain[0]), 1.0)


@pytest.mark.parametrize(
    "extra",
    [
        {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},  # gpt-oss
        {},  # Qwen3's: defaults, truncated ramp ends
        {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707},  # DeepSeek's attention factor
        {"attention_factor": 1.25},
    ],
)
def test_yarn_matches_transformers(extra: dict) -> None:
    """Inverse frequencies and the cos/sin scale, as transformers computes them for the same rope_parameters."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "rope_theta": 150000.0}
    params.update(extra)
    cfg = LlamaConfig(
        hidden_size=512, num_attention_heads=8, head_dim=64, max_position_embeddings=131072, rope_parameters=params
    )
    ref, ref_scale = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    mine = yarn(64, 150000.0, params, None)
    assert not torch.equal(mine.inv_freq, rope_inv_freq(64, 150000.0))
    torch.testing.assert_close(mine.inv_freq, ref.float(), rtol=1e-6, atol=0)
    cache = RotaryCache(64, 300, 150000.0, params)
    assert mine.attention_factor == pytest.approx(ref_scale) and ref_scale != 1.0
    freqs = torch.outer(torch.arange(300, dtype=torch.float32), ref.float())
    torch.testing.assert_close(cache.cos, freqs.cos() * ref_scale, rtol=1e-6, atol=1e-7)


def test_unknown_scaling_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="dynamic"):
        rope_inv_freq(32, 10000.0, {"rope_type": "dynamic", "factor": 4.0})


def test_odd_head_dim_is_refused() -> None:
    with pytest.raises(ValueError, match="even head_dim"):
        RotaryCache(7, 16, 10000.0)
