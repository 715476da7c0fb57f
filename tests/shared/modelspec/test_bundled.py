from __future__ import annotations

import json

import pytest

from shared.modelspec import bundled


def test_unknown_bundled_name_names_the_known_ones():
    with pytest.raises(ValueError, match="bundled:smollm2-135m-instruct"):
        bundled.resolve_model_path("bundled:gpt-99")


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        bundled.resolve_model_path(str(tmp_path))


def test_local_directory_is_returned_as_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert bundled.resolve_model_path(str(tmp_path)) == tmp_path


@pytest.mark.slow
def test_prepared_bundled_model_loads_and_answers(bundled_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    marker = json.loads((bundled_model_dir / "pdrelay-prepared.json").read_text())
    assert marker["source"].endswith(".gguf")
    # idempotent: a second call returns the same directory without rebuilding it
    before = (bundled_model_dir / "model.safetensors").stat().st_mtime_ns
    assert bundled.resolve_model_path("bundled:smollm2-135m-instruct") == bundled_model_dir
    assert (bundled_model_dir / "model.safetensors").stat().st_mtime_ns == before

    tok = AutoTokenizer.from_pretrained(bundled_model_dir)
    model = AutoModelForCausalLM.from_pretrained(bundled_model_dir)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_prepare_into_custom_cache_dir(tmp_path, monkeypatch):
    """A fresh cache dir gets its own prepared copy (conversion stubbed to keep this test fast)."""
    calls = []

    def fake_convert(src, dst, progress):
        calls.append(src)
        dst.mkdir(parents=True)
        (dst / "config.json").write_text("{}")

    monkeypatch.setattr(bundled, "_convert_gguf", fake_convert)
    lines: list[str] = []
    p1 = bundled.prepare_bundled("smollm2-135m-instruct", tmp_path, progress=lines.append)
    p2 = bundled.prepare_bundled("smollm2-135m-instruct", tmp_path, progress=lines.append)
    assert p1 == p2 == tmp_path / "smollm2-135m-instruct"
    assert len(calls) == 1, "second prepare must reuse the cache"
    assert any("prepared" in line for line in lines)
    assert not list(tmp_path.glob(".*tmp*")), "no temporary directory left behind"
