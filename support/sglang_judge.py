"""Run inside a side environment (support/sglang_env.py): judge /generate bodies with SGLang's
own code, step by step as its HTTP server and tokenizer manager run them.

``python -m support.sglang_judge TOKENIZER_JSON [PLUGIN_PACKAGE]`` reads one JSON request per line on stdin,
``{"body": {...}, "plugin": bool}``, and writes one JSON verdict per line (``SGLangJudge`` runs
it from the service's venv):

- ``request_error``: ``GenerateReqInput(**body).normalize_batch_and_arguments()`` (every release);
- ``has_contract_gate`` / ``contract_error``: the JSON contract gate of 0.5.22 and later
  (``api_contract.generate_contract_error``), which runs before the request class;
- ``decoder_prompt`` / ``processor_error``: what the Whisper multimodal processor makes of the
  request on this CPU (the audio really decoded and turned into features), as the tokenizer
  manager calls it: ``input_ids`` from the request, then the processor's ids replace them.
  The processor is SGLang's own, chosen the way SGLang chooses it (``import_processors`` and
  ``get_mm_processor``), or with ``plugin`` the one SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE
  registers over it (by default sglang-plugin/'s asr_whisper_prompt);
- ``sampling_params`` / ``sampling_error``: what is left of ``sampling_params`` after the
  processor, and what ``SamplingParams(**...)``, ``normalize`` and ``verify`` say of it, as
  ``_create_tokenized_object`` does.

Each error is null when SGLang accepts. The model files are this project's packaged Whisper
tokenizer (the path on the command line) with transformers' Whisper feature extractor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

PLUGIN_PACKAGE = "asr_whisper_prompt"
VOCAB_SIZE = 51865  # multilingual Whisper
ROOT = Path(__file__).resolve().parent.parent
SIDE_ENVS = ROOT / ".sglang"  # built by `make sglang-envs` (support/sglang_env.py)
SGLANG_VERSIONS = ("0.5.21", "0.5.23")  # the Makefile builds the same list


class SGLangJudge:
    """The judge of one SGLang release, as a child process of this interpreter with the release's
    side folder, this repository and the plugin (sglang-plugin/) on its path. It starts at once
    and is waited for at the first judgement (SGLang takes seconds to import). Thread-safe."""

    def __init__(self, version: str, tokenizer_file: Path, plugin_package: str = PLUGIN_PACKAGE,
                 plugin_folder: Path = ROOT / "sglang-plugin"):
        side = SIDE_ENVS / version
        if not (side / ".complete").exists():
            raise FileNotFoundError(f"{side} is missing: `make sglang-envs` builds it")
        path = os.pathsep.join(map(str, (side, ROOT, plugin_folder)))
        self.version = version
        command = [sys.executable, "-m", "support.sglang_judge", str(tokenizer_file), plugin_package]
        self._process = subprocess.Popen(command,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                         env={**os.environ, "PYTHONPATH": path})
        self._lock = threading.Lock()
        self._ready = False

    def judge(self, body: dict, plugin: bool) -> dict:
        with self._lock:
            if not self._ready:
                if json.loads(self._read()) != {"ready": True}:
                    raise RuntimeError(f"SGLang {self.version}'s judge did not start")
                self._ready = True
            self._process.stdin.write(json.dumps({"body": body, "plugin": plugin}) + "\n")
            self._process.stdin.flush()
            return json.loads(self._read())

    def _read(self) -> str:
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"SGLang {self.version}'s judge exited ({self._process.wait()}): see its stderr")
        return line

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait(timeout=30)


def _processors(tokenizer_file: str, plugin_package: str):
    """(SGLang's Whisper processor, the plugin's), built through SGLang's registry."""
    from sglang.srt.managers.multimodal_processor import get_mm_processor, import_processors
    from sglang.srt.runtime_context import get_context
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizerFast

    server_args = get_context().override_server_args(mm_process_config={}).install()
    hf_processor = WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80),
                                    tokenizer=WhisperTokenizerFast(tokenizer_file=tokenizer_file))
    hf_config = WhisperConfig(vocab_size=VOCAB_SIZE, decoder_start_token_id=50258,
                              architectures=["WhisperForConditionalGeneration"])
    import_processors("sglang.srt.multimodal.processors")
    builtin = get_mm_processor(hf_config, server_args, hf_processor, "default")
    import_processors(plugin_package, overwrite=True)
    plugin = get_mm_processor(hf_config, server_args, hf_processor, "default")
    assert type(plugin).__module__.startswith(plugin_package), type(plugin)
    return builtin, plugin, hf_processor.tokenizer


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def judge(body: dict, processor, tokenizer, contract_error) -> dict:
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    verdict = {"has_contract_gate": contract_error is not None,
               "contract_error": contract_error(json.loads(json.dumps(body))) if contract_error else None,
               "request_error": None, "decoder_prompt": None, "processor_error": None, "sampling_params": None,
               "sampling_error": None}
    try:
        obj = GenerateReqInput(**json.loads(json.dumps(body)))
        obj.normalize_batch_and_arguments()
    except Exception as e:
        verdict["request_error"] = _error(e)
        return verdict
    audio = obj.audio_data if isinstance(obj.audio_data, list) else [obj.audio_data]
    try:
        out = asyncio.run(processor.process_mm_data_async(image_data=None, audio_data=audio,
                                                          input_text=obj.text or obj.input_ids, request_obj=obj))
        verdict["decoder_prompt"] = list(out.input_ids) if out.input_ids is not None else obj.input_ids
    except Exception as e:
        verdict["processor_error"] = _error(e)
        return verdict
    verdict["sampling_params"] = obj.sampling_params
    try:
        sampling = SamplingParams(**obj.sampling_params)
        sampling.normalize(tokenizer)
        sampling.verify(VOCAB_SIZE)
    except Exception as e:
        verdict["sampling_error"] = _error(e)
    return verdict


def main() -> None:
    warnings.filterwarnings("ignore")  # SGLang warns at import about GPU-only kernels
    logging.basicConfig(level=logging.ERROR)  # and about processors of other models it cannot import
    try:
        from sglang.srt.entrypoints.api_contract import generate_contract_error
    except ImportError:  # before 0.5.22: no contract gate
        generate_contract_error = None
    builtin, plugin, tokenizer = _processors(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else PLUGIN_PACKAGE)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        processor = plugin if request.get("plugin") else builtin
        print(json.dumps(judge(request["body"], processor, tokenizer, generate_contract_error)), flush=True)


if __name__ == "__main__":
    main()
