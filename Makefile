PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-serve

.PHONY: install sglang-fetch sglang-envs test test-setup fuzz load-test serve transcribe bench bench-quick bench-long bench-hard bench-stream bench-diarization bench-page bench-realtime speech-tools clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Python writes the bytecode of each module the first time a process imports it (into the venv,
# and __pycache__ here), so later processes start without compiling. An environment that turns
# this off (PYTHONDONTWRITEBYTECODE, as some containers do) would have every process compile all
# it imports, seconds a server start; compiling the whole venv ahead instead (compileall)
# compiles several times the modules anything here imports. pip's own compiling runs on one
# core and is most of an install's time, so it is off too.
export PYTHONDONTWRITEBYTECODE :=
PIP_INSTALL := $(BIN)/pip install --quiet --no-compile

# torch pinned: the CPU wheel (an unpinned torch pulls a multi-GB CUDA build). Serving needs the
# project's own dependencies only; the tests add the dev extra (pytest, the OpenAI SDK, selenium,
# hypothesis, transformers, ...) to the same venv.
$(SERVE_STAMP): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) torch==2.13.0 -e .
	touch $(SERVE_STAMP)

$(STAMP): $(SERVE_STAMP)
	$(PIP_INSTALL) -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# tests/server/test_page.py drives Debian's Chromium through its chromedriver (never a browser
# download). Installed once with apt-get when running as root, as CI does; otherwise that
# test skips and says why.
CHROMEDRIVER := /usr/bin/chromedriver
$(CHROMEDRIVER):
	@if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "not root: chromium and chromium-driver not installed, tests/server/test_page.py will skip"; fi

# SGLang's own request code for tests/server/test_sglang_contract.py: each release in a side folder
# run on this venv's interpreter (support/sglang_env.py), never installed into the venv.
# Fetched with pip alone (beside the venv's own install under `make -j`), then checked to import
# on the finished venv.
SGLANG_VERSIONS := 0.5.21 0.5.23
sglang-fetch: | $(BIN)/python
	$(BIN)/python -m support.sglang_env install .sglang $(SGLANG_VERSIONS)

sglang-envs: $(STAMP) sglang-fetch
	$(BIN)/python -m support.sglang_env check .sglang $(SGLANG_VERSIONS)

# tests/server/test_page.py's accessibility check runs axe-core (the npm package, never committed) in
# the page: fetched once with the machine's npm into .axe/; without npm that check skips.
AXE := .axe/node_modules/axe-core/axe.min.js
$(AXE):
	@if command -v npm >/dev/null; then npm install --no-save --no-audit --no-fund --prefix .axe axe-core@4.14.1 >/dev/null; \
	else echo "npm not found: the page's accessibility check will skip"; fi

# The modules run on PYTEST_WORKERS workers (pytest-xdist), each module whole on one worker, so
# a module's servers start once; PYTEST_WORKERS=0 runs them in this process. One worker per core,
# at most 4: every worker loads the model and starts its modules' servers, and a container may
# show more cores than its CPU quota gives it.
PYTEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
# The set-up steps run side by side (-j): pip is mostly one core at a time, and the SGLang
# folders, axe-core and the Debian packages do not wait for the venv.
test:
	$(MAKE) -j4 --output-sync=target test-setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-setup: $(STAMP) $(CHROMEDRIVER) $(AXE) speech-tools sglang-envs

# Longer hostile-input run than CI's: fresh randomness, more cases (FUZZ_EXAMPLES per property).
FUZZ_EXAMPLES ?= 500
fuzz: $(STAMP)
	ASR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) ASR_FUZZ_RANDOM=1 $(BIN)/python -m pytest -s tests/slow/test_fuzz.py

# The load test at full length (CI runs a shorter one): LOAD_SECONDS of mixed traffic.
LOAD_SECONDS ?= 60
load-test: $(STAMP)
	ASR_LOAD_SECONDS=$(LOAD_SECONDS) $(BIN)/python -m pytest -s tests/slow/test_load.py

# The main job: the OpenAI-compatible server on 127.0.0.1:8000 with the packaged model.
serve: $(SERVE_STAMP)
	$(BIN)/asr-service serve --host 127.0.0.1 --port 8000 $(ARGS)

# A file from the command line: make transcribe FILE=speech.wav [ARGS="--response-format srt"]
transcribe: $(SERVE_STAMP)
	@test -n "$(FILE)" || { echo "usage: make transcribe FILE=path/to/audio [ARGS='--language fr ...']"; exit 2; }
	$(BIN)/asr-service transcribe $(FILE) $(ARGS)

# Side-by-side measurements against faster-whisper (and HF) on the same weights.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PIP_INSTALL) -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) speech-tools
	$(BIN)/python -m bench

# The page's workbench on a 30-minute diarized file in headless Chromium: stalls and timings.
bench-page: $(BENCH_STAMP) $(CHROMEDRIVER) speech-tools
	$(BIN)/python -m bench.page_long_file

bench-quick: $(BENCH_STAMP) speech-tools
	$(BIN)/python -m bench --quick

# Realtime: where one session's time goes, latency and WER through a live server (also under
# file load), and the first words on the page's live line in headless Chromium.
bench-realtime: $(BENCH_STAMP) $(CHROMEDRIVER)
	$(BIN)/python -m bench.realtime_breakdown
	$(BIN)/python -m bench.realtime_latency --load
	$(BIN)/python -m bench.page_live

# The long-form workload (support/dialogue.py) is synthesized with Debian's Festival voices and
# espeak-ng: installed once with apt-get when running as root, as CI does; otherwise the tests
# that need them skip and say why. Scored by support/transcript_score.py (tests and bench-long).
SPEECH_VOICES := /usr/share/festival/voices/us/cmu_us_slt_arctic_hts /usr/share/festival/voices/english/kal_diphone \
	/usr/share/festival/voices/english/ked_diphone
# After chromium's apt-get (order-only): two apt-gets cannot run at once.
speech-tools: | $(CHROMEDRIVER)
	@command -v espeak-ng >/dev/null && ls -d $(SPEECH_VOICES) >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq festival festvox-us-slt-hts \
			festvox-kallpc16k festvox-kdlpc16k espeak-ng >/dev/null; \
		else echo "not root: festival voices and espeak-ng not installed, the long-audio tests will skip"; fi; }

bench-long: $(BENCH_STAMP) speech-tools
	$(BIN)/python -m bench.long_audio

# Speech that repeats itself: every repeat found, in every format, against faster-whisper.
bench-hard: $(BENCH_STAMP) speech-tools
	$(BIN)/python -m bench.hard_audio

# A stream against its full response on the same long files: first text, total time, same bytes.
bench-stream: $(BENCH_STAMP) speech-tools
	$(BIN)/python -m bench.stream_release

# Diarization error rate, speaker count and added time on support/speakers.py's voices.
bench-diarization: $(BENCH_STAMP) speech-tools
	$(BIN)/python -m bench.diarization

clean:
	rm -rf $(VENV) build *.egg-info
