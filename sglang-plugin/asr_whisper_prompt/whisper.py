"""PromptedWhisperProcessor: SGLang's Whisper processor, with the decoder prompt taken from the
request's ``input_ids`` when they are a Whisper prompt.

SGLang's processor (``sglang/srt/multimodal/processors/whisper.py``, the same from 0.5.11 to
0.5.23) always builds the decoder prompt itself: ``<|startoftranscript|>`` alone for its private
``_detect_language`` key, else ``<|startoftranscript|><|lang|><|transcribe|><|notimestamps|>``
(or ``<|0.00|>``). Translate and previous text cannot be asked for, and 0.5.22+ refuse the keys
on ``/generate``. Here a request whose ``input_ids`` open with ``<|startoftranscript|>``, or with
``<|startofprev|>`` and hold ``<|startoftranscript|>`` later, is decoded with exactly those ids;
the audio features are computed by SGLang's own code, as before. Any other request (SGLang's
own transcription endpoint sends ``text: ""``) goes through SGLang's processor unchanged.
"""

from __future__ import annotations

from sglang.srt.multimodal.processors.whisper import WhisperProcessor

START_OF_TRANSCRIPT = "<|startoftranscript|>"
START_OF_PREVIOUS = "<|startofprev|>"


class PromptedWhisperProcessor(WhisperProcessor):
    models = list(WhisperProcessor.models)

    async def process_mm_data_async(self, image_data, audio_data, input_text, request_obj, **kwargs):
        prompt = self.requested_prompt(request_obj.input_ids)
        output = await super().process_mm_data_async(image_data, audio_data, input_text, request_obj, **kwargs)
        if output is not None and prompt is not None:
            output.input_ids = prompt
        return output

    def requested_prompt(self, input_ids) -> list[int] | None:
        """The request's ids when they are a Whisper decoder prompt, else None."""
        if not input_ids or not isinstance(input_ids[0], int):  # absent, or a batch (lists)
            return None
        sot, prev = self._tokenizer.convert_tokens_to_ids([START_OF_TRANSCRIPT, START_OF_PREVIOUS])
        if input_ids[0] == sot:
            return list(input_ids)
        if input_ids[0] == prev:
            if sot not in input_ids:
                raise ValueError(f"a Whisper prompt that opens with {START_OF_PREVIOUS} needs "
                                 f"{START_OF_TRANSCRIPT} after the previous text")
            return list(input_ids)
        return None
