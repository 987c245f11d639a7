"""Command line: ``asr-service serve`` and ``asr-service transcribe FILE [FILE ...]``: the flags, the
settings they make, and the dispatch (the file batch itself is ``cli_batch``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from .audio import AudioLimits
from .cli_batch import output_paths, transcribe_files
from .flag_environment import EnvironmentFlagError, EnvironmentFlags
from .formats import RESPONSE_FORMATS
from .model_loading import DEFAULT_MODEL, ModelLoadError
from .realtime.session import RealtimeLimits
from .request_options import OPTIONS, OptionError
from .runtime import DEVICES, ENGINES, QUANTIZATIONS, RuntimeSettings
from .server.admission import AdmissionLimits
from .server.auth import ENV_VAR, keys_from
from .server.connections import DEFAULT_MAX_CONNECTIONS, ConnectionLimits
from .server.model_pool import check_entries, parse_model_entry
from .server.request_form import STREAM_FORMATS
from .server.state import DEFAULT_MODELS


QUANTIZE_HELP = ("auto (default): bf16 where the CPU has AVX512-BF16 or AMX, else none; bf16: the encoder's and "
                 "the decoder's matrix products in bfloat16; none: float32; int8: dynamic int8 linear layers "
                 "(a sequence's result then depends on its batch)")


def _http_url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text) <= len("https://"):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL (e.g. http://gpu1:30000)")
    return text


def _add_option_args(p: argparse.ArgumentParser) -> None:
    """The request options, as the HTTP form has them (request_options.OPTIONS), as flags."""
    for option in OPTIONS:
        if option.kind is bool:
            p.add_argument(option.flag, action=argparse.BooleanOptionalAction, help=option.help)
        elif option.kind is list:
            p.add_argument(option.flag, nargs="+", type=option.parse, metavar="VALUE", help=option.help)
        else:
            p.add_argument(option.flag, type=_checked(option), help=option.help)
    # Shorthands: --beam-size N is use_beam_search with n beams; --word-timestamps asks for words.
    p.add_argument("--beam-size", type=_checked(next(o for o in OPTIONS if o.name == "n")),
                   help="beam search with this many beams, 1 for greedy (default: 5 with the embedded engine)")
    p.add_argument("--word-timestamps", action="store_true", help="words with start/end times (verbose_json)")


def _checked(option):
    def parse(text: str):
        try:
            return option.parse(text)
        except OptionError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = option.name  # argparse names the option in its message
    return parse


def _option_values(args) -> dict[str, object]:
    values = {option.name: vars(args)[option.name] for option in OPTIONS}
    if args.beam_size is not None:
        values.update(use_beam_search=args.beam_size > 1, n=args.beam_size)
    if args.word_timestamps:
        values["timestamp_granularities"] = [*(values["timestamp_granularities"] or []), "word"]
    return values


MODEL_HELP = ("a packaged model name (whisper-base), a CTranslate2 or HF model directory, or a hub repository id "
              "(owner/name[@revision], fetched with huggingface_hub: HF_HOME, HF_HUB_OFFLINE, HF_TOKEN apply)")


def _runtime_settings(args, model: str) -> RuntimeSettings:
    return RuntimeSettings(model=model, engine=args.engine, device=args.device, quantize=args.quantize,
                           threads=args.threads, max_batch_size=args.max_batch_size,
                           max_audio_windows=args.max_audio_windows,
                           sglang_urls=tuple(args.sglang_url), sglang_retry_after_s=args.sglang_retry_after)


def _add_engine_args(add) -> None:
    """The engine's flags, through ``add`` (a parser's add_argument, or EnvironmentFlags.add)."""
    add("--threads", type=int, help="torch threads (default: all cores)")
    add("--max-batch-size", type=int, default=RuntimeSettings.max_batch_size,
        help="sequences decoded together (each beam of a search is one)")
    add("--max-audio-windows", type=int, default=RuntimeSettings.max_audio_windows,
        help="30 s windows decoded at once (each holds its cross-attention K/V: for whisper-base 18 MB in bf16, "
             "37 MB in float32); the beams of a search share one")
    add("--quantize", choices=QUANTIZATIONS, default="auto", help=QUANTIZE_HELP)
    add("--device", choices=DEVICES, help="where the embedded engine runs (default: cuda when "
                                          "torch sees a GPU, else cpu); float16 on cuda")
    add("--engine", choices=ENGINES, default="embedded",
        help="embedded: decode in this process; sglang: send every decode to SGLang servers")
    add("--sglang-url", nargs="+", default=[], metavar="URL", type=_http_url,
        help="SGLang servers (or one SGLang router) for --engine sglang; work goes to the one with the "
             "least outstanding decodes")
    add("--sglang-retry-after", type=float, default=2.0, metavar="SECONDS",
        help="how long a failed SGLang server is left out (doubling on each failure in a row, up to 60 s)")


def _build_parser() -> tuple[argparse.ArgumentParser, EnvironmentFlags]:
    """The parser, and the serve flags that ASR_ environment variables can also set."""
    parser = argparse.ArgumentParser(prog="asr-service", description="OpenAI-compatible Whisper speech-to-text")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_transcribe_command(sub)
    env = _add_serve_command(sub)
    return parser, env


def _add_transcribe_command(sub: argparse._SubParsersAction) -> None:
    """The transcribe command: files in, one result each (several decode in one batch)."""
    t = sub.add_parser("transcribe", help="transcribe (or translate) audio files")
    t.add_argument("files", nargs="+", type=Path)
    t.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    t.add_argument("--response-format", choices=(*RESPONSE_FORMATS, "rttm"), default="json",
                   help="rttm: the speakers' turns, diarized (NIST RTTM)")
    _add_option_args(t)
    t.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    _add_engine_args(t.add_argument)
    t.add_argument("--max-bytes", type=int, default=AudioLimits.max_bytes, help="largest input file in bytes")
    t.add_argument("--max-seconds", type=float, default=AudioLimits.max_seconds, help="longest decoded audio")
    t.add_argument("--output-dir", type=Path,
                   help="write each result to DIR/<name>.<ext> (atomically); files already there are skipped, "
                        "so an interrupted batch resumes where it stopped")
    t.add_argument("-v", "--verbose", action="store_true")


def _add_serve_command(sub: argparse._SubParsersAction) -> EnvironmentFlags:
    """The serve command's flags; each but the API keys also from its ASR_ environment variable."""
    s = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server",
                       description="Every flag can also be set by the environment variable named after it "
                                   "(flags win); the API keys' variable is ASR_API_KEYS.")
    env = EnvironmentFlags(s)
    env.add("--host", default="127.0.0.1")
    env.add("--port", type=int, default=8000)
    env.add("--model", action="append", metavar="SPEC[=NAME,...]",
            help=f"{MODEL_HELP}; repeatable: one served model each, the first the default (a request naming no "
                 f"model gets it), served under NAME,... (default: SPEC). Without --model: "
                 f"{DEFAULT_MODEL}={','.join(DEFAULT_MODELS[0].names)}")
    env.add("--served-model-name", nargs="+", metavar="NAME",
            help="with one --model: the names it is served under (as vLLM's flag; instead of =NAME,...)")
    env.add("--max-loaded-models", type=int, metavar="N",
            help="models loaded at once (default: all); past it the least recently used idle one is unloaded "
                 "for the next, and a model not loaded at start loads on first use")
    env.add("--model-idle-timeout", type=float, metavar="SECONDS",
            help="unload a model (not the default) after this long without a request (default: never)")
    _add_engine_args(env.add)
    env.add("--max-bytes", type=int, default=AudioLimits.max_bytes, help="largest upload in bytes")
    env.add("--max-seconds", type=float, default=AudioLimits.max_seconds, help="longest decoded audio")
    env.add("--default-stream-format", choices=STREAM_FORMATS, default="openai",
            help="what stream=true sends when a request names no stream_format: openai (transcript.text.* "
                 "events, the OpenAI SDK) or chunk (choices[0].delta.content, as vLLM and SGLang send)")
    env.add("--detection-mode", choices=("fused", "two-stage"), default="fused",
            help="two-stage (separate detection decode) is a baseline for bench/ only")
    _add_server_limits(s, env)
    return env


def _add_server_limits(s: argparse.ArgumentParser, env: EnvironmentFlags) -> None:
    """Realtime sessions, keys, backpressure, connections and shutdown."""
    env.add("--max-realtime-sessions", type=int, default=RealtimeLimits.max_sessions,
            help="concurrent /v1/realtime sessions; more are refused")
    env.add("--realtime-idle-timeout", type=float, default=RealtimeLimits.idle_timeout_s,
            help="seconds without audio from the client before a realtime session is closed")
    env.add("--realtime-max-buffer-seconds", type=float, default=RealtimeLimits.max_buffer_seconds,
            help="audio a realtime session may hold untranscribed")
    env.add("--realtime-max-session-seconds", type=float, default=RealtimeLimits.max_session_seconds,
            help="longest life of a realtime session; it then ends with session_expired")
    s.add_argument("--api-key", action="append", metavar="KEY",
                   help=f"require this key (repeatable; also {ENV_VAR}, comma-separated); /health stays open")
    env.add("--max-pending-requests", type=int, default=AdmissionLimits.max_pending_requests,
            help="requests admitted and unfinished before new ones get 429")
    env.add("--max-pending-audio-seconds", type=float, default=AdmissionLimits.max_pending_audio_seconds,
            help="audio seconds admitted and unfinished before new requests get 429")
    env.add("--request-timeout", type=float, default=600.0,
            help="deadline per HTTP request, from its first byte to its answer (s)")
    env.add("--max-connections", type=int, default=ConnectionLimits.max_connections,
            help=f"open connections (HTTP and WebSocket) before new ones get 503 (default: "
                 f"{DEFAULT_MAX_CONNECTIONS}, or what the open-files limit leaves room for)")
    env.add("--header-timeout", type=float, default=ConnectionLimits.header_timeout_s,
            help="seconds a connection has to send a request's headers")
    env.add("--keep-alive-timeout", type=float, default=ConnectionLimits.keep_alive_s,
            help="seconds an idle connection stays open after a response")
    env.add("--body-timeout", type=float, default=ConnectionLimits.body_timeout_s,
            help="longest pause inside an upload before it gets 408 (s)")
    env.add("--lingering-time", type=float, default=ConnectionLimits.lingering_time_s,
            help="after an early answer (401, 413, 429 ...): seconds the rest of a body still coming is read "
                 "and dropped before the connection closes (nginx's lingering_time)")
    env.add("--shutdown-grace", type=float, default=30.0,
            help="seconds SIGTERM waits for in-flight work before exiting")
    env.add("--log-level", default="info")


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """The command line, with serve's flags that it does not give taken from ASR_ variables."""
    parser, serve_flags = _build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        try:
            argv = ["serve", *serve_flags.words(environ, argv[1:]), *argv[1:]]
        except EnvironmentFlagError as e:
            parser.error(str(e))
    return parser.parse_args(argv)


def _server_settings(args):
    from .server.state import ServerSettings

    models = _served_models(args)
    return ServerSettings(
        runtime=_runtime_settings(args, models[0].spec), models=models, max_loaded_models=args.max_loaded_models,
        model_idle_timeout_s=args.model_idle_timeout, detection=args.detection_mode,
        default_stream_format=args.default_stream_format,
        limits=AudioLimits(args.max_bytes, args.max_seconds),
        realtime=RealtimeLimits(max_sessions=args.max_realtime_sessions, idle_timeout_s=args.realtime_idle_timeout,
                                max_buffer_seconds=args.realtime_max_buffer_seconds,
                                max_session_seconds=args.realtime_max_session_seconds),
        admission=AdmissionLimits(args.max_pending_requests, args.max_pending_audio_seconds),
        request_timeout_s=args.request_timeout, api_keys=keys_from(args.api_key),
        connections=ConnectionLimits(max_connections=args.max_connections, header_timeout_s=args.header_timeout,
                                     keep_alive_s=args.keep_alive_timeout, body_timeout_s=args.body_timeout,
                                     lingering_time_s=args.lingering_time),
    )


def _served_models(args) -> tuple:
    """--model entries (with --served-model-name's names for a single one); ValueError when they
    do not combine."""
    entries = tuple(parse_model_entry(text) for text in args.model) if args.model else DEFAULT_MODELS
    if args.served_model_name:
        if len(entries) > 1:
            raise ValueError("--served-model-name names a single --model; with several, give each its names as "
                             "--model SPEC=NAME,...")
        entries = (replace(entries[0], names=tuple(args.served_model_name)),)
    if len(entries) > 1 and args.engine == "sglang":
        raise ValueError("--engine sglang serves one model (the one its SGLang servers load); give one --model")
    check_entries(entries, args.max_loaded_models)
    return entries


def _serve(args) -> int:
    from .server.runner import connection_plan_for, serve

    try:
        settings = _server_settings(args)
        plan = connection_plan_for(settings)
    except ValueError as e:  # a cap the open-files limit cannot hold: said before anything starts
        print(f"error: {e}", file=sys.stderr)
        return 2
    return serve(settings, args.host, args.port, args.log_level, args.shutdown_grace, plan)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    try:
        output_paths(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from .runtime import build_runtime  # heavy imports only once arguments are valid

    try:
        runtime = build_runtime(_runtime_settings(args, args.model))
    except (ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(transcribe_files(args, runtime, _option_values(args)))
    except OptionError as e:
        print(f"error: {e.param}: {e}", file=sys.stderr)
        return 2
    finally:
        runtime.close()


if __name__ == "__main__":
    sys.exit(main())
