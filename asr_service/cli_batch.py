"""The command line's file batch: every input file decoded together (their windows share the
engine's batch), each result printed in input order or written atomically to --output-dir as
soon as it is done, so that a killed batch resumes with the files still to do."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import numpy as np

from .audio import AudioError, AudioLimits, decode_audio
from .formats import render, to_rttm
from .request_options import OptionError, build_diarization, build_options


def _error_line(message: str, code: str) -> str:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": "file", "code": code}})


EXTENSIONS = {"json": "json", "verbose_json": "json", "text": "txt", "srt": "srt", "vtt": "vtt",
              "diarized_json": "json", "rttm": "rttm"}
PARTIAL = ".partial"  # suffix of a result being written; never a finished one


def output_paths(args) -> list[Path] | None:
    if args.output_dir is None:
        return None
    outputs = [args.output_dir / f"{path.stem}.{EXTENSIONS[args.response_format]}" for path in args.files]
    seen: dict[Path, Path] = {}
    for path, out in zip(args.files, outputs):
        if out in seen:
            raise ValueError(f"{seen[out]} and {path} would both be written to {out}")
        seen[out] = path
    return outputs


def write_atomically(path: Path, text: str) -> None:
    """Temp file in the same folder, flushed to disk, then renamed over the target: a reader (or
    a resumed run) sees either no file or the whole result, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}{PARTIAL}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def reference_file(limits: AudioLimits):
    """The command line's known speaker references: files, at most ``limits.max_bytes`` read."""
    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                data = f.read(limits.max_bytes + 1)
        except OSError as e:
            raise OptionError("known_speaker_references", f"Cannot read the reference {path!r}: {e.strerror}") from None
        if len(data) > limits.max_bytes:
            raise OptionError("known_speaker_references", f"The reference {path!r} is larger than "
                                                          f"{limits.max_bytes} bytes")
        return data
    return read


async def transcribe_files(args, runtime, values: dict[str, object]) -> int:
    """Every file of ``args.files`` (the ones not yet written, with --output-dir) decoded with the
    request options ``values``; results reported in input order; the exit status."""
    from .diarization.pipeline import diarizer_for, reference_clips, transcribe_with_speakers  # only when used

    limits = AudioLimits(args.max_bytes, args.max_seconds)
    decoded_as = "diarized_json" if args.response_format == "rttm" else args.response_format  # RTTM: its turns
    diarization = build_diarization(values, args.task, decoded_as, reference_file(limits))
    options = build_options(values, runtime.adapter, args.task, decoded_as, diarized=diarization is not None,
                            default_beam_size=runtime.default_beam_size)
    refusal = runtime.transcriber.refusal(options)
    if refusal is not None:
        raise OptionError(refusal.param or "engine", f"not supported by this engine: {refusal}")
    if diarization is not None:
        diarizer = diarizer_for(runtime.transcriber)
        clips = await reference_clips(diarization, limits)
    outputs = output_paths(args)
    todo = _files_to_do(args, outputs)
    audios = [_read_audio(args.files[i], limits) for i in todo]
    progress = _progress_bar([a for a in audios if not isinstance(a, Exception)], runtime)

    async def one(i, audio):
        if isinstance(audio, Exception):
            return audio
        decoded = []  # the windows done; the silence between them is skipped, not decoded

        def chunk_done(chunk) -> None:
            spanned = chunk.end - chunk.start  # a window that leaves out silence spans more than it holds
            decoded.append(spanned)
            progress.advance(spanned)

        on_chunk_done = chunk_done if progress else None
        if diarization is None:
            result = await runtime.transcriber.transcribe(audio, options, on_chunk_done=on_chunk_done)
        else:
            result = await transcribe_with_speakers(runtime.transcriber, diarizer, audio, options, diarization, clips,
                                                    on_chunk_done)
        if progress:
            progress.advance(audio.shape[0] / runtime.adapter.config.sample_rate - sum(decoded))
        if outputs is not None:  # written as soon as it is done: a killed batch keeps it
            write_atomically(outputs[i], _written(result, args.files[i], args.response_format))
        return result

    # All files go to the engine together: their chunks share its batch.
    results = await asyncio.gather(*(one(i, a) for i, a in zip(todo, audios)))
    if progress:
        progress.close()
    return _report(args, todo, results, outputs)


def _files_to_do(args, outputs: list[Path] | None) -> list[int]:
    """The input files (by index) still to transcribe: with --output-dir, those whose result is
    not there yet (a partial write of a killed run is removed)."""
    todo = list(range(len(args.files)))
    if outputs is None:
        return todo
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for leftover in args.output_dir.glob(f".*{PARTIAL}"):  # from a run that was killed mid-write
        leftover.unlink()
    for i in (i for i in todo if outputs[i].exists()):
        print(f"skipping {args.files[i]}: {outputs[i]} exists", file=sys.stderr)
    return [i for i in todo if not outputs[i].exists()]


def _read_audio(path: Path, limits: AudioLimits) -> np.ndarray | Exception:
    """The file's samples, or why they could not be read (reported on its own line)."""
    try:
        return decode_audio(path.read_bytes(), limits)
    except (OSError, AudioError) as e:
        return e


def _written(result, path: Path, response_format: str) -> str:
    return to_rttm(result, path.stem) if response_format == "rttm" else render(result, response_format)


def _report(args, todo: list[int], results: list, outputs: list[Path] | None) -> int:
    """Each file's result (or error) on stdout in input order; the exit status."""
    status = 0
    json_lines = args.response_format.endswith("json")  # one JSON object per line, in input order
    for i, result in zip(todo, results):
        path = args.files[i]
        if isinstance(result, Exception):
            status = 1
            if json_lines and outputs is None:
                print(_error_line(f"{path}: {result}", result.code if isinstance(result, AudioError) else "file_not_readable"))
            else:
                print(f"error: {path}: {result}", file=sys.stderr)
        elif outputs is not None:
            print(f"wrote {outputs[i]}", file=sys.stderr)
        elif json_lines:
            print(_written(result, path, args.response_format))
        else:
            print(_written(result, path, args.response_format).rstrip("\n") + ("\n" if len(args.files) > 1 else ""))
    return status


class _ChunkProgress:
    """tqdm over chunks, shown only on a terminal and only when there is something long to wait for."""

    def __init__(self, total_seconds: float):
        from tqdm import tqdm

        self._bar = tqdm(total=round(total_seconds, 1), unit="s audio", file=sys.stderr)

    def advance(self, seconds: float) -> None:
        self._bar.update(round(seconds, 1))

    def close(self) -> None:
        self._bar.close()


def _progress_bar(audios, runtime):
    total = sum(a.shape[0] for a in audios) / runtime.adapter.config.sample_rate
    if sys.stderr.isatty() and total > runtime.adapter.config.max_clip_seconds:
        return _ChunkProgress(total)
    return None
