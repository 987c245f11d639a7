"""The /generate bodies the front builds, judged by SGLang's own code (not a reading of it): every
release in SGLANG_VERSIONS, installed by `make test` into side folders (support/sglang_env.py),
runs its contract gate, request class, Whisper multimodal processor (on this CPU, on a real clip)
and SamplingParams on each body (support/sglang_judge.py).

Before the fix in wire.generate_body, every body was refused by GenerateReqInput on both
releases ("Either text, input_ids or input_embeds should be provided."), and 0.5.22+ refused the
private ``_detect_language`` key, the only way the front had to send its prompt. Bodies now go
one of two ways (wire.Carrier): ``input_ids`` for servers with the asr_whisper_prompt plugin
(sglang-plugin/), whose processor must turn them into exactly the intended decoder prompt on
every release, and ``detect_key`` for 0.5.21 without it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from asr_service.engine.sglang.wire import Carrier, forced_tokens, generate_body
from support.clips import load_clip
from support.sglang_judge import ROOT, SGLANG_VERSIONS, SIDE_ENVS, SGLangJudge

pytestmark = pytest.mark.server

OLDEST, CURRENT = SGLANG_VERSIONS[0], SGLANG_VERSIONS[-1]


def kinds(adapter) -> dict:
    """One DecodeParams of every kind the front sends."""
    sampled = replace(adapter.build_prompt("en"), temperature=0.4, top_k=5, top_p=0.9, min_p=0.05, seed=7,
                      repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=-0.5)
    return {"fused detection": adapter.build_fused_autodetect_params(),
            "fused with timestamps": adapter.build_fused_autodetect_params("transcribe", True),
            "known language": adapter.build_prompt("fr"),
            "translate": adapter.build_prompt("de", "translate"),
            "timestamps": adapter.build_prompt("en", "transcribe", True),
            "previous text": adapter.build_prompt("en", previous_text="The quick brown fox."),
            "previous text, fused": adapter.build_fused_autodetect_params(previous_text="Bonjour tout le monde."),
            "sampling": sampled,
            "canary": adapter.build_canary(previous_text="Hello.").params}


def carried(adapter, carrier: Carrier) -> dict:
    """name -> (params, body) for what ``carrier`` can send (detect_key: no previous text)."""
    audio = load_clip("en", "quick_brown_fox")
    return {name: (params, generate_body(f"rid-{i}", audio, params, carrier))
            for i, (name, params) in enumerate(kinds(adapter).items())
            if carrier is Carrier.INPUT_IDS or params.prompt_ids[0] == adapter.tok.sot}


@pytest.fixture(scope="module")
def verdicts(adapter, sglang_judges):
    """(version, carrier, plugin) -> name -> (params, verdict)."""
    out = {}
    for version, judge in sglang_judges.items():
        for carrier in Carrier:
            for plugin in (False, True):
                out[version, carrier, plugin] = {name: (params, judge.judge(body, plugin))
                                                 for name, (params, body) in carried(adapter, carrier).items()}
    return out


def errors(verdicts: dict, *keys: str) -> dict:
    return {name: {k: v[k] for k in keys if v[k]} for name, (_, v) in verdicts.items() if any(v[k] for k in keys)}


def assert_intended_prompts(judged: dict) -> None:
    assert not errors(judged, "contract_error", "request_error", "processor_error", "sampling_error")
    # SGLang's processor path with the plugin's class: the decoder prompt is the front's own.
    wrong = {name: (v["decoder_prompt"], list(params.prompt_ids)) for name, (params, v) in judged.items()
             if v["decoder_prompt"] != list(params.prompt_ids)}
    assert not wrong, wrong
    # The constraint forces nothing: the whole prompt went as input_ids.
    assert all("_detect_language" not in v["sampling_params"] for _, v in judged.values())


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_with_the_plugin_every_body_is_accepted_and_becomes_the_intended_prompt(verdicts, version):
    judged = verdicts[version, Carrier.INPUT_IDS, True]
    assert_intended_prompts(judged)
    # vLLM's sampling extras reach SGLang's SamplingParams under their own names (and pass verify).
    sampling = judged["sampling"][1]["sampling_params"]
    assert (sampling["min_p"], sampling["repetition_penalty"], sampling["frequency_penalty"],
            sampling["presence_penalty"]) == (0.05, 1.2, 0.5, -0.5)


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_the_upstream_diff_makes_sglangs_own_processor_keep_the_prompt(runtime, adapter, version, tmp_path: Path):
    """docs/sglang-whisper-prompt.diff, applied to the release's own processor module (with
    git apply), does what the plugin does."""
    inner = Path("python/sglang/srt/multimodal/processors/whisper.py")
    (tmp_path / inner).parent.mkdir(parents=True)
    shutil.copy(SIDE_ENVS / version / "sglang/srt/multimodal/processors/whisper.py", tmp_path / inner)
    subprocess.run(["git", "apply", str(ROOT / "docs/sglang-whisper-prompt.diff")], cwd=tmp_path, check=True)
    package = tmp_path / "patched" / "upstream_whisper"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(tmp_path / inner, package / "whisper.py")
    judge = SGLangJudge(version, runtime.loaded.tokenizer_file, "upstream_whisper", tmp_path / "patched")
    try:
        assert_intended_prompts({name: (params, judge.judge(body, plugin=True))
                                 for name, (params, body) in carried(adapter, Carrier.INPUT_IDS).items()})
        # And SGLang's own ways still work: the private key, and a body with no Whisper prompt.
        for name, (params, body) in carried(adapter, Carrier.DETECT_KEY).items():
            verdict = judge.judge(body, plugin=True)
            if version == SGLANG_VERSIONS[0]:
                assert verdict["decoder_prompt"] == [adapter.tok.sot], name
        plain = {**body, "sampling_params": {"language": "fr"}}
        plain.pop("input_ids", None)
        tok = adapter.tok
        assert judge.judge(plain, plugin=True)["decoder_prompt"] == [tok.sot, tok.language_ids["fr"], tok.transcribe,
                                                                      tok.no_timestamps]
    finally:
        judge.close()


def test_without_the_plugin_0_5_21_takes_the_private_key_and_the_constraint_forces_the_rest(verdicts, adapter):
    judged = verdicts[OLDEST, Carrier.DETECT_KEY, False]
    assert not errors(judged, "contract_error", "request_error", "processor_error", "sampling_error")
    for name, (params, v) in judged.items():
        # SGLang's own processor: [<|startoftranscript|>], the key popped before SamplingParams.
        assert v["decoder_prompt"] == [adapter.tok.sot], name
        assert "_detect_language" not in v["sampling_params"], name
        assert [v["decoder_prompt"][0], *forced_tokens(params, Carrier.DETECT_KEY)] == list(params.prompt_ids)


def test_the_plugin_leaves_bodies_without_a_whisper_prompt_to_sglang(verdicts):
    """With the plugin installed, the private key still works on 0.5.21 (and SGLang's own
    transcription endpoint, which sends text "", is served as before)."""
    assert verdicts[OLDEST, Carrier.DETECT_KEY, True] == verdicts[OLDEST, Carrier.DETECT_KEY, False]


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_without_the_plugin_input_ids_are_replaced_by_sglangs_english_prompt(verdicts, adapter, version):
    """What the canary decode detects: a server without the plugin takes the body and decodes
    something else than was asked."""
    tok = adapter.tok
    judged = verdicts[version, Carrier.INPUT_IDS, False]
    assert not errors(judged, "contract_error", "request_error", "processor_error", "sampling_error")
    english = [tok.sot, tok.language_ids["en"], tok.transcribe, tok.no_timestamps]
    assert all(v["decoder_prompt"] == english for _, v in judged.values())


def test_current_sglang_refuses_the_private_key_at_its_contract_gate(verdicts):
    for plugin in (False, True):
        judged = verdicts[CURRENT, Carrier.DETECT_KEY, plugin]
        assert judged and all(v["has_contract_gate"] for _, v in judged.values())
        refused = errors(judged, "contract_error")
        assert refused.keys() == judged.keys()
        assert all("unknown field `_detect_language`" in e["contract_error"] for e in refused.values()), refused


def test_the_plugin_installs_with_pip_and_works_from_where_pip_puts_it(runtime, adapter, tmp_path: Path):
    """The install line of docs/scaling-out.md, into a folder standing for the SGLang host's
    environment: a wheel with no dependencies, whose installed copy SGLang's registry loads."""
    source = shutil.copytree(ROOT / "sglang-plugin", tmp_path / "source")  # builds leave files behind
    site = tmp_path / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site), str(source)], check=True)
    metadata = next(site.glob("asr_whisper_prompt-*.dist-info")) / "METADATA"
    assert "Requires-Dist" not in metadata.read_text()
    judge = SGLangJudge(CURRENT, runtime.loaded.tokenizer_file, plugin_folder=site)
    try:
        assert_intended_prompts({name: (params, judge.judge(body, plugin=True))
                                 for name, (params, body) in carried(adapter, Carrier.INPUT_IDS).items()})
    finally:
        judge.close()
