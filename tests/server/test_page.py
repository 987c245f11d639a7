"""The browser page at / in real headless Chromium (Debian's chromium + chromedriver, driven by
Selenium): Chromium's fake microphone plays a real speech WAV, and the live transcript has to
show the words, then the recording opens in the file workbench. The workbench, on a four-voice
conversation: timeline blocks by speaker, every word rendered, the highlighted word following
playback, clicks that seek, and each download parsed (srt and webvtt-py for the subtitles).
Screenshots of each state are saved under test-artifacts/."""

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import jiwer
import numpy as np
import pytest
import soundfile as sf
import srt
import webvtt

from support.clips import clip_path, load_clip, reference
from support.speakers import SCRIPT, SHORT_TURNS
from support.textnorm import normalize, spoken

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("CI"):  # CI installs them (make test does, as root): their absence is a failure there
        raise RuntimeError("chromium and chromedriver are missing; `make test` installs them with apt-get")
    pytest.skip("Debian's chromium and chromium-driver are not installed (make test installs them as root)",
                allow_module_level=True)

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = pytest.mark.server


KEY = "sk-page-test-key"
# axe-core, the accessibility rules engine, fetched by `make test` with npm (Makefile: AXE).
AXE = Path(__file__).resolve().parents[2] / ".axe/node_modules/axe-core/axe.min.js"
WCAG_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]


@pytest.fixture(scope="module")
def server(start_server):
    return start_server("--threads", "2", "--api-key", KEY)  # the page sends the key it is given


def trimmed(name: str) -> np.ndarray:
    """An English clip without its leading and trailing silence."""
    audio = load_clip("en", name)
    loud = np.flatnonzero(np.abs(audio) > 0.02)
    return audio[max(0, loud[0] - 800) : loud[-1] + 800]


@pytest.fixture(scope="module")
def microphone_wav(tmp_path_factory) -> Path:
    """What the fake microphone plays, over and over: a pause, ~10 s of speech with short gaps
    (one turn for server VAD), a pause."""
    silence, gap = np.zeros(16000, dtype=np.float32), np.zeros(2400, dtype=np.float32)
    speech = [trimmed("counting"), gap, trimmed("quick_brown_fox"), gap, trimmed("counting")]
    path = tmp_path_factory.mktemp("mic") / "speech.wav"
    sf.write(path, np.concatenate([silence, *speech, silence, silence]), 16000, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def browser(microphone_wav, tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                 f"--use-file-for-fake-audio-capture={microphone_wav}", "--autoplay-policy=no-user-gesture-required",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}", "--window-size=1200,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.downloads = tmp_path_factory.mktemp("downloads")  # where the page's downloads land
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(driver.downloads)})
    # Whatever the server's Content-Security-Policy blocks on a page is kept in window.cspViolations.
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": (
        "window.cspViolations = []; document.addEventListener('securitypolicyviolation', "
        "e => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));")})
    yield driver
    driver.quit()


def screenshot(driver, name: str, showing: str | None = None) -> Path:
    """The window as it is, scrolled first to the element with id ``showing``."""
    if showing:
        driver.execute_script("document.getElementById(arguments[0]).scrollIntoView()", showing)
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    return path


def test_microphone_speech_shows_up_live_on_the_page(server, browser):
    browser.get(server.url + "/")
    assert browser.find_element(By.CSS_SELECTOR, "label[for=live-language]").text == "Language"
    browser.find_element(By.ID, "api-key").send_keys(KEY)
    # Test-side watcher: the text of each unfinished line, every time the page changes it.
    browser.execute_script("""
        window.partialTexts = [];
        new MutationObserver(() => document.querySelectorAll('#transcript li.partial .text').forEach(
            (span) => span.textContent && window.partialTexts.push(span.textContent))
        ).observe(document.getElementById('transcript'), {subtree: true, childList: true, characterData: true});""")
    browser.find_element(By.ID, "record").click()
    try:
        WebDriverWait(browser, 90, poll_frequency=0.2).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#transcript li.final"))
    finally:
        shot = screenshot(browser, "page-live-transcript.png")
    finished = browser.find_elements(By.CSS_SELECTOR, "#transcript li.final")
    assert len(finished) == 1 and "quick brown fox jumps over the lazy dog" in finished[0].text.lower(), finished[0].text
    partials = browser.execute_script("return window.partialTexts")
    finished_text = finished[0].find_element(By.CLASS_NAME, "text").text
    # Words showed while the speech was still playing; the final line is the utterance's file
    # decode, put in the preview's place, which says the same words (its punctuation may differ:
    # "1, 2, 3," previewed, "1-2-3" final).
    assert partials and spoken(finished_text).startswith(spoken(partials[0])), (partials, finished_text)
    assert finished[0].find_element(By.CLASS_NAME, "lang").text == "en"
    assert browser.find_element(By.ID, "record").get_attribute("aria-pressed") == "true"
    assert "Error" not in browser.find_element(By.ID, "live-status").text
    times = finished[0].find_element(By.CLASS_NAME, "when").text  # where the server's VAD heard the turn
    start, end = (sum(int(p) * 60 ** i for i, p in enumerate(reversed(t.split(":")))) for t in times.split("–"))
    assert 0 <= start < end, times
    browser.find_element(By.ID, "record").click()  # stop: the microphone and the socket close
    assert browser.find_element(By.ID, "live-status").text == "Not recording."
    assert shot.stat().st_size > 10_000
    # What was recorded opens in the workbench: transcribed again as a file, drawn, playable.
    browser.find_element(By.ID, "open-recording").click()
    wait_for_file_result(browser, 120)
    assert "quick brown fox jumps over the lazy dog" in browser.find_element(By.ID, "file-text").text.lower()
    assert browser.find_element(By.ID, "waveform-note").text == ""  # the browser decoded it: drawn
    assert browser.execute_script("return document.getElementById('player').duration") > 5
    screenshot(browser, "page-live-recording-in-workbench.png", showing="file-result")


def wait_for_file_result(browser, seconds: float) -> None:
    WebDriverWait(browser, seconds, poll_frequency=0.2).until(
        lambda d: d.find_element(By.ID, "file-status").text == "Done." or "Error" in d.find_element(By.ID, "file-status").text)
    assert browser.find_element(By.ID, "file-status").text == "Done."


def test_upload_shows_the_language_and_refuses_a_wrong_key(server, browser, tmp_path):
    browser.get(server.url + "/")
    upload = tmp_path / "bonjour.wav"
    browser.find_element(By.ID, "api-key").send_keys("sk-wrong")
    browser.find_element(By.ID, "file").send_keys(str(clip_path("en", "hello_world")))
    browser.find_element(By.CSS_SELECTOR, "#upload button[type=submit]").click()
    WebDriverWait(browser, 30, poll_frequency=0.2).until(lambda d: "Error" in d.find_element(By.ID, "file-status").text)
    assert "invalid_api_key" in browser.find_element(By.ID, "file-status").text
    browser.get(server.url + "/")
    browser.find_element(By.ID, "api-key").send_keys(KEY)
    shutil.copy(clip_path("fr", "bonjour_monde"), upload)
    browser.find_element(By.ID, "file").send_keys(str(upload))
    browser.find_element(By.CSS_SELECTOR, "#upload button[type=submit]").click()
    wait_for_file_result(browser, 60)
    screenshot(browser, "page-upload.png", showing="file-result")
    assert browser.find_element(By.ID, "file-language-out").text == "fr"
    assert "% sure" in browser.find_element(By.ID, "file-language-probability").text
    text = browser.find_element(By.ID, "file-text").text
    assert normalize(text) == normalize(reference("fr", "bonjour_monde")), text
    # Nothing asked for speakers: one lane, no legend, no diarized download.
    assert browser.find_elements(By.CSS_SELECTOR, "#legend li") == []
    assert [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#downloads a")] == ["SRT", "VTT", "Text", "JSON"]
    # Detection confined to a list that lacks French answers from the list.
    browser.find_element(By.ID, "allowed-languages").send_keys("de, en")
    browser.find_element(By.CSS_SELECTOR, "#upload button[type=submit]").click()
    WebDriverWait(browser, 60, poll_frequency=0.2).until(
        lambda d: d.find_element(By.ID, "file-language-out").text in ("de", "en")
        or "Error" in d.find_element(By.ID, "file-status").text)
    wait_for_file_result(browser, 60)


def accessibility_violations(browser) -> list[dict]:
    """axe-core's WCAG 2.1 A/AA violations on the page as it is (labels, names, contrast, ...)."""
    browser.execute_script(AXE.read_text(encoding="utf-8"))
    return browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        axe.run(document, {runOnly: {type: "tag", values: arguments[0]}}).then((r) => done(r.violations.map(
            (v) => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map((n) => n.target.join(" "))}))));
        """, WCAG_AA)


def downloaded(browser, name: str) -> str:
    path = browser.downloads / name
    WebDriverWait(browser, 20, poll_frequency=0.2).until(lambda d: path.exists() and path.stat().st_size > 0)
    return path.read_text(encoding="utf-8")


def current_word(browser) -> int:
    return int(browser.find_element(By.ID, "file-transcript").get_attribute("data-current-word") or -1)


def test_workbench_shows_who_spoke_when_and_follows_the_playback(server, browser, four_voices, tmp_path):
    audio, _ = four_voices
    talk = tmp_path / "meeting.wav"
    sf.write(talk, audio, 16000, subtype="PCM_16")
    browser.get(server.url + "/")
    browser.find_element(By.ID, "api-key").send_keys(KEY)
    browser.find_element(By.ID, "file").send_keys(str(talk))
    browser.find_element(By.ID, "diarize").click()
    browser.find_element(By.CSS_SELECTOR, "#upload button[type=submit]").click()
    # The stream's text shows while the rest decodes.
    WebDriverWait(browser, 120, poll_frequency=0.1).until(
        lambda d: d.find_element(By.ID, "progress-text").text or d.find_element(By.ID, "file-status").text == "Done.")
    screenshot(browser, "page-workbench-progress.png", showing="file-status")
    wait_for_file_result(browser, 180)
    assert browser.find_element(By.ID, "progress").get_attribute("hidden")

    links = browser.find_elements(By.CSS_SELECTOR, "#downloads a")
    assert [a.text for a in links] == ["SRT", "VTT", "Text", "JSON", "Diarized JSON"]
    for link in links:
        link.click()
    result = json.loads(downloaded(browser, "meeting.json"))  # the verbose_json the page holds
    segments, words = result["segments"], result["words"]
    # The page streamed its request: it holds and shows exactly the stream=false response.
    full = httpx.post(server.url + "/v1/audio/transcriptions", headers={"Authorization": f"Bearer {KEY}"},
                      data={"response_format": "verbose_json", "diarize": "true",
                            "timestamp_granularities[]": ["segment", "word"]},
                      files={"file": ("meeting.wav", talk.read_bytes(), "audio/wav")}, timeout=300).json()
    assert result["text"] == full["text"]
    assert browser.find_element(By.ID, "file-text").text == " ".join(full["text"].split())  # as the DOM reads out
    assert segments == full["segments"] and words == full["words"]
    speakers = sorted({s["speaker"] for s in segments})
    assert len(speakers) >= 3, speakers  # four voices; diarization's own tests judge who is who

    # The timeline: a block per segment, in a lane and a colour per speaker.
    blocks = browser.find_elements(By.CSS_SELECTOR, "#blocks .block")
    assert len(blocks) == len(segments)
    colour_of = {}
    for block, segment in zip(blocks, segments):
        assert segment["speaker"] in block.get_attribute("aria-label")
        colour_of.setdefault(segment["speaker"], set()).add(block.value_of_css_property("background-color"))
    assert all(len(c) == 1 for c in colour_of.values()), colour_of
    assert len({c.pop() for c in colour_of.values()}) == len(speakers)
    assert [li.text.split(":")[0] for li in browser.find_elements(By.CSS_SELECTOR, "#legend li")] == speakers
    # Every word rendered, in order, each shaded by its probability.
    rendered = browser.find_elements(By.CSS_SELECTOR, "#file-transcript .word")
    assert [w.text for w in rendered] == [w["word"] for w in words]
    assert all(0 <= w["probability"] <= 1 for w in words)
    # ... each under its own segment.
    shown = [("".join(w.text for w in p.find_elements(By.CLASS_NAME, "word")), p.find_element(By.CLASS_NAME, "who").text)
             for p in browser.find_elements(By.CSS_SELECTOR, "#file-transcript .segment")]
    assert shown == [("".join(s["text"].split()), s["speaker"]) for s in segments]
    doubts = browser.execute_script(
        "return [...document.querySelectorAll('#file-transcript .word')].map(e => Number(e.style.getPropertyValue('--doubt')))")
    assert doubts == pytest.approx([1 - w["probability"] for w in words], abs=1e-3)
    spoken = " ".join(text for _, text in SCRIPT[:SHORT_TURNS])  # the words are the conversation's
    assert jiwer.wer(normalize(spoken), normalize(" ".join(w["word"] for w in words))) < 0.2
    screenshot(browser, "page-workbench.png", showing="file-result")

    # Playback: the highlighted word moves on with the audio.
    browser.execute_script("document.getElementById('player').play()")
    seen = []
    for _ in range(16):
        time.sleep(0.25)
        seen.append(current_word(browser))
    browser.execute_script("document.getElementById('player').pause()")
    advancing = [i for i in seen if i >= 0]
    assert len(set(advancing)) >= 3 and advancing == sorted(advancing), seen
    position = browser.execute_script("return document.getElementById('player').currentTime")
    index = current_word(browser)
    if index >= 0:  # the word outlined is one that has started
        assert words[index]["start"] <= position + 0.05, (index, position)
    else:  # paused in a pause: no word is being spoken
        assert not any(w["start"] <= position <= w["end"] for w in words), position
    # A click on a word, then on a timeline block, moves the playback there.
    target = len(words) // 2
    # In view first: segments out of view are laid out only as they come into it (the click
    # must land where the word is once it is).
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", rendered[target])
    WebDriverWait(browser, 5).until(lambda d: rendered[target].is_displayed())
    rendered[target].click()
    assert browser.execute_script("return document.getElementById('player').currentTime") == pytest.approx(
        words[target]["start"], abs=0.01)
    assert current_word(browser) == target
    assert "current" in rendered[target].get_attribute("class")
    # The keyboard: an arrow key in the transcript steps to the next word.
    browser.find_element(By.ID, "file-transcript").send_keys(Keys.ARROW_RIGHT)
    assert current_word(browser) == target + 1
    assert browser.execute_script("return document.getElementById('player').currentTime") == pytest.approx(
        words[target + 1]["start"], abs=0.01)
    blocks[-1].click()
    assert browser.execute_script("return document.getElementById('player').currentTime") == pytest.approx(
        segments[-1]["start"], abs=0.01)
    screenshot(browser, "page-workbench-seek.png", showing="file-transcript")

    # Each take-away file, parsed.
    cues = list(srt.parse(downloaded(browser, "meeting.srt")))
    assert [t for c in cues for t in (c.start.total_seconds(), c.end.total_seconds())] == pytest.approx(
        [t for s in segments for t in (s["start"], s["end"])], abs=0.001)
    assert [c.content for c in cues] == [f"{s['speaker']}: {s['text'].strip()}" for s in segments]
    captions = webvtt.from_string(downloaded(browser, "meeting.vtt"))
    assert [(c.voice, c.text) for c in captions] == [(s["speaker"], s["text"].strip()) for s in segments]
    assert [c.start_time.in_milliseconds() / 1000 for c in captions] == pytest.approx(
        [s["start"] for s in segments], abs=0.001)
    assert downloaded(browser, "meeting.txt") == result["text"] + "\n"
    diarized = json.loads(downloaded(browser, "meeting.diarized.json"))
    assert [(s["speaker"], s["text"]) for s in diarized["segments"]] == [(s["speaker"], s["text"].strip()) for s in segments]
    assert all(s["type"] == "transcript.text.segment" for s in diarized["segments"])


    # A phone-sized window: the workbench still fits its width.
    browser.set_window_size(390, 844)
    try:
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
        screenshot(browser, "page-workbench-phone.png", showing="file-result")
    finally:
        browser.set_window_size(1200, 900)



def test_the_page_and_its_workbench_are_accessible(server, browser):
    """axe-core's WCAG 2.1 A/AA rules (names, labels, contrast, ...), on the page as it opens and
    with a diarized result in the workbench."""
    if not AXE.exists():
        if os.environ.get("CI") and shutil.which("npm"):  # `make test` fetches it wherever npm is
            raise AssertionError(f"{AXE} is missing although npm is here; `make test` fetches axe-core")
        pytest.skip("axe-core is not fetched (`make test` does it with npm)")
    browser.get(server.url + "/")
    assert accessibility_violations(browser) == []
    browser.find_element(By.ID, "api-key").send_keys(KEY)
    browser.find_element(By.ID, "file").send_keys(str(clip_path("en", "quick_brown_fox")))
    browser.find_element(By.ID, "diarize").click()
    browser.find_element(By.CSS_SELECTOR, "#upload button[type=submit]").click()
    wait_for_file_result(browser, 60)
    assert browser.find_elements(By.CSS_SELECTOR, "#blocks .block") and browser.find_elements(By.CSS_SELECTOR, ".word")
    assert accessibility_violations(browser) == []
    assert browser.execute_script("return window.cspViolations") == []  # the page lives within its policy
