"""`pdrelay model check DIR`: "ok: ..." and exit 0 for a servable directory, "cannot serve: <the field and what is
supported>" and exit 1 otherwise (one line, no traceback)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from services.cli import main
from tests.helpers.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("check"), "mistral", heads=4, kv_heads=2)


def _check(d: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["model", "check", str(d)])
    out = capsys.readouterr()
    assert out.err == ""
    return rc, out.out


def _edit_config(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_servable(mistral_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(mistral_dir, capsys)
    assert rc == 0
    assert out.startswith("ok: MistralForCausalLM (mistral): 2 layers") and "sliding window 6 on 2 of 2" in out


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_moe_servable_and_its_experts_checked(family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = make_tiny_model(tmp_path, family, hidden=32, heads=4, kv_heads=2)
    capsys.readouterr()  # transformers' progress bar while saving
    rc, out = _check(d, capsys)
    assert rc == 0 and "8 experts top-2 of size 18" in out, out
    assert ("(1 dense layer)" in out) == (family == "qwen3_moe")
    # an expert's tensor missing from the checkpoint: named
    weights = load_file(str(d / "model.safetensors"))
    name = next(n for n in weights if ".experts.7." in n or n.endswith("experts.down_proj_bias"))
    del weights[name]
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    rc, out = _check(d, capsys)
    assert rc == 1 and out.startswith("cannot serve: ") and name in out and len(out.splitlines()) == 1


@pytest.mark.parametrize(
    "changes,expect",
    [
        ({"auto_map": {"AutoModelForCausalLM": "m.X"}}, "auto_map is set"),
        ({"architectures": ["FalconForCausalLM"], "model_type": "falcon"}, "'FalconForCausalLM'"),
        ({"rope_parameters": {"rope_type": "longrope", "factor": 4.0}}, "rope_type 'longrope'"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization 'bitsandbytes' is not supported"),
    ],
)
def test_refused_config_names_the_field(
    mistral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict, expect: str
) -> None:
    rc, out = _check(_edit_config(mistral_dir, tmp_path / "m", **changes), capsys)
    assert rc == 1 and out.startswith("cannot serve: ") and expect in out and len(out.splitlines()) == 1
    if "architecture" in out or "auto_map" in out:
        assert "MistralForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM" in out


def test_missing_and_misshaped_tensors(mistral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "m"
    shutil.copytree(mistral_dir, d)
    sd = load_file(str(d / "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, str(d / "model.safetensors"))
    rc, out = _check(d, capsys)
    assert rc == 1 and "missing tensor(s) model.layers.1.mlp.up_proj.weight" in out
    bad = _edit_config(mistral_dir, tmp_path / "b", intermediate_size=99)
    rc, out = _check(bad, capsys)
    assert rc == 1 and "model.layers.0.mlp.down_proj.weight has shape" in out


def test_no_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(tmp_path, capsys)
    assert rc == 1 and "has no config.json" in out


@pytest.mark.parametrize("role", ["worker", "prefill", "decode"])
def test_engine_roles_refuse_an_unsupported_model_before_joining_the_cluster(
    role: str, mistral_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line naming the field, exit 2, and no etcd needed (none runs here: a role that got that far would say it
    cannot reach etcd instead)."""
    import importlib

    bad = _edit_config(mistral_dir, tmp_path / "m", quantization_config={"quant_method": "bitsandbytes"})
    main_of = importlib.import_module(f"services.{role}.__main__").main
    try:
        rc = main_of(["--model", str(bad), "--etcd-endpoints", "http://127.0.0.1:9"])
    except SystemExit as e:  # refused while its config resolves (quant_passes.py), the way argparse exits
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith(
        f"pdrelay serve {role}: error: --model {bad}: quantization 'bitsandbytes' is not supported; supported: fp8"
    )


def test_a_bert_model_is_the_encoders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bert = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": 100,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
    }
    (tmp_path / "config.json").write_text(json.dumps(bert))
    rc, out = _check(tmp_path, capsys)
    assert rc == 0 and "an embedding model" in out and "--encoder-model" in out
    (tmp_path / "config.json").write_text(json.dumps(dict(bert, hidden_act="swish")))
    rc, out = _check(tmp_path, capsys)
    assert rc == 1 and "hidden_act 'swish'" in out


def test_deepseek_is_servable_and_an_unknown_router_is_refused_by_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers.tiny_mla import make_tiny_mla

    d = make_tiny_mla(tmp_path, "v3")
    capsys.readouterr()  # transformers' progress bars while saving
    rc, out = _check(d, capsys)
    assert rc == 0 and out.startswith("ok: DeepseekV3ForCausalLM (deepseek_v3): 2 layers") and "MLA" in out
    rc, out = _check(_edit_config(d, tmp_path / "moe", first_k_dense_replace=1, topk_method="noaux"), capsys)
    assert rc == 1 and out.startswith("cannot serve: ") and len(out.splitlines()) == 1
    assert "topk_method 'noaux'" in out and "noaux_tc" in out
