"""SGLang multimodal processor plugin for Whisper: the decoder prompt comes from the request.

SGLang imports every module of the package named in ``SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE``
and registers their processor classes over its own for the same architecture
(``sglang.srt.managers.multimodal_processor.import_processors(..., overwrite=True)``). The class
lives in ``whisper``; this file imports nothing, so the package imports without SGLang too.
"""
