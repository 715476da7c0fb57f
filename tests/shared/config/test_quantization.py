"""A checkpoint's quantization_config: parsed when supported, refused in one line naming the method otherwise (in
the config parse, in the resolution passes, at a service's start); --quantization and --kv-cache-dtype fp8_e4m3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared.config import ConfigError, resolve
from shared.config.quantization import QuantSpec, parse_quantization
from tests.helpers.quantized_models import ct_config

FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
BNB = {"quant_method": "bitsandbytes", "bits": 4, "load_in_4bit": True}
CT_INT4 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}
    },
}


def _llama(quant: dict | None) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
    }
    return cfg | ({"quantization_config": quant} if quant is not None else {})


def test_fp8_block_parses_and_plain_checkpoints_have_none() -> None:
    assert parse_quantization(_llama(FP8_BLOCK)) == QuantSpec("fp8", (128, 128))
    assert parse_quantization(_llama(None)) is None
    assert parse_quantization(_llama(AWQ)) == QuantSpec("awq", group_size=128)
    assert parse_quantization(_llama(GPTQ)) == QuantSpec("gptq", group_size=128, zero_offset=1)
    v2 = parse_quantization(_llama(GPTQ | {"checkpoint_format": "gptq_v2"}))
    assert v2 is not None and v2.zero_offset == 0


@pytest.mark.parametrize(
    ("quant", "named"),
    [
        (AWQ | {"bits": 3}, "quantization 'awq' (3-bit) is not supported"),
        (AWQ | {"version": "gemv"}, "quantization 'awq' version 'gemv' is not supported"),
        (GPTQ | {"desc_act": True}, "quantization 'gptq' with desc_act (act-order) is not supported"),
        (GPTQ | {"bits": 8}, "quantization 'gptq' (8-bit) is not supported"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quantization 'bitsandbytes' is not supported"),
        (CT_INT4, "quantization 'compressed-tensors (int 4-bit, group)' in format 'pack-quantized' is not"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "'fp8' per-tensor (no weight_block_size)"),
        (FP8_BLOCK | {"activation_scheme": "static"}, "'fp8' with activation_scheme 'static'"),
    ],
)
def test_unsupported_methods_are_refused_by_name_with_what_is_supported(quant: dict, named: str) -> None:
    from shared.engine.models.config import parse_model_config

    with pytest.raises(ValueError) as e:
        parse_model_config(_llama(quant), source="m/config.json")
    msg = str(e.value)
    assert msg.startswith("m/config.json: ") and named in msg and "\n" not in msg
    assert "supported: fp8 (block-wise e4m3" in msg and "awq (4-bit, zero point, gemm)" in msg and "gptq (" in msg


def _model_dir(tmp_path: Path, quant: dict | None) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_llama(quant)))
    return d


def test_the_resolution_refuses_an_unsupported_checkpoint_at_start(tmp_path: Path, ctx) -> None:
    d = _model_dir(tmp_path, BNB)
    for role in ("worker", "prefill", "decode"):
        with pytest.raises(
            ConfigError, match=r"quantization 'bitsandbytes' \(4-bit\) is not supported; supported: fp8"
        ):
            resolve(role, ["--model", str(d)], env={}, ctx=ctx)


def test_quantization_flag_must_match_the_checkpoint(tmp_path: Path, ctx) -> None:
    plain = _model_dir(tmp_path, None)
    with pytest.raises(ConfigError, match=r"^--quantization awq: .* is not a quantized checkpoint and only fp8"):
        resolve("worker", ["--model", str(plain), "--quantization", "awq"], env={}, ctx=ctx)
    assert resolve("worker", ["--model", str(plain), "--quantization", "fp8"], env={}, ctx=ctx).model.quantization
    fp8 = tmp_path / "fp8"
    fp8.mkdir()
    (fp8 / "config.json").write_text(json.dumps(_llama(FP8_BLOCK)))
    with pytest.raises(ConfigError, match=r"^--quantization awq: .* is quantized with 'fp8'"):
        resolve("worker", ["--model", str(fp8), "--quantization", "awq"], env={}, ctx=ctx)
    cfg = resolve("worker", ["--model", str(fp8), "--quantization", "fp8"], env={}, ctx=ctx)
    assert cfg.model.quantization == "fp8"
    with pytest.raises(ConfigError, match="--quantization"):
        resolve("worker", ["--quantization", "int3"], env={}, ctx=ctx)
    ct = tmp_path / "ct"
    ct.mkdir()
    (ct / "config.json").write_text(json.dumps(_llama(ct_config("channel"))))
    for name in ("compressed-tensors", "fp8"):  # SGLang's name for the method, or the weights' format
        assert resolve("worker", ["--model", str(ct), "--quantization", name], env={}, ctx=ctx).model.quantization
    with pytest.raises(ConfigError, match=r"^--quantization gptq: .* is quantized with 'compressed-tensors'"):
        resolve("worker", ["--model", str(ct), "--quantization", "gptq"], env={}, ctx=ctx)


def test_fp8_kv_cache_takes_the_torch_attention(ctx, make_ctx) -> None:
    cfg = resolve("decode", ["--kv-cache-dtype", "fp8_e4m3"], env={}, ctx=ctx)
    assert cfg.cache.kv_cache_dtype == "fp8_e4m3" and cfg.kernels.attention_backend == "torch"
    assert cfg.provenance["kernels.attention_backend"].source == "derived"
    gpu = resolve("decode", ["--kv-cache-dtype", "fp8_e4m3"], env={}, ctx=make_ctx(cuda=True, gpus=1))
    assert gpu.kernels.attention_backend == "torch"
    with pytest.raises(
        ConfigError, match=r"--attention-backend native reads KV pages of the model's dtype \(float32\), not fp8_e4m3"
    ):
        resolve("decode", ["--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "native"], env={}, ctx=ctx)
    plain = resolve("decode", env={}, ctx=ctx)
    assert plain.cache.kv_cache_dtype == "float32" and plain.kernels.attention_backend == "auto"  # as before
    mixed = resolve("decode", ["--kv-cache-dtype", "bfloat16", "--dtype", "float32"], env={}, ctx=ctx)
    assert mixed.kernels.attention_backend == "torch"  # bf16 pages under an fp32 model: the torch ops too


@pytest.mark.parametrize(
    "argv",
    [["serve", "worker", "--device", "cpu"], ["up", "--dry-run", "--prefill", "1", "--decode", "1"]],
    ids=["service", "up"],
)
def test_a_start_refuses_in_one_line(tmp_path: Path, argv: list[str]) -> None:
    d = _model_dir(tmp_path, BNB)
    p = subprocess.run(
        [sys.executable, "-m", "services.cli", *argv, "--model", str(d)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)},
        cwd=Path(__file__).resolve().parents[3],
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and len(lines) == 1, p.stderr
    assert "quantization 'bitsandbytes' (4-bit) is not supported; supported: fp8" in lines[0]
