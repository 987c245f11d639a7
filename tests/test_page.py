"""The browser page at / in real headless Chromium (Debian's chromium + chromedriver, driven by
Selenium): Chromium's fake microphone plays a real speech WAV, and the live transcript has to
show the words; the upload form has to show text, language and segments. Screenshots are
saved under test-artifacts/."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from support.clips import clip_path, load_clip, reference
from support.textnorm import normalize

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("CI"):  # CI installs them (make test does, as root): their absence is a failure there
        raise RuntimeError("chromium and chromedriver are missing; `make test` installs them with apt-get")
    pytest.skip("Debian's chromium and chromium-driver are not installed (make test installs them as root)",
                allow_module_level=True)

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = pytest.mark.server


KEY = "sk-page-test-key"


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
    yield driver
    driver.quit()


def screenshot(driver, name: str) -> Path:
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
        new MutationObserver(() => document.querySelectorAll('#transcript li.partial').forEach(
            (li) => li.textContent && window.partialTexts.push(li.textContent))
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
    # Words showed while the speech was still playing, and the final line continued them.
    assert partials and finished[0].text.startswith(partials[0]), (partials, finished[0].text)
    assert finished[0].find_element(By.CLASS_NAME, "lang").text == "en"
    assert browser.find_element(By.ID, "record").get_attribute("aria-pressed") == "true"
    assert "Error" not in browser.find_element(By.ID, "live-status").text
    browser.find_element(By.ID, "record").click()  # stop: the microphone and the socket close
    assert browser.find_element(By.ID, "live-status").text == "Not recording."
    assert shot.stat().st_size > 10_000


def test_upload_form_shows_text_language_and_segments(server, browser, tmp_path):
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
    WebDriverWait(browser, 60, poll_frequency=0.2).until(
        lambda d: d.find_element(By.ID, "file-status").text in ("Done.",) or "Error" in d.find_element(By.ID, "file-status").text)
    screenshot(browser, "page-upload.png")
    assert browser.find_element(By.ID, "file-status").text == "Done."
    assert browser.find_element(By.ID, "file-language-out").text == "fr"
    text = browser.find_element(By.ID, "file-text").text
    assert normalize(text) == normalize(reference("fr", "bonjour_monde")), text
    rows = browser.find_elements(By.CSS_SELECTOR, "#segments tr")
    assert len(rows) == 1 and rows[0].find_elements(By.TAG_NAME, "td")[2].text.strip() == text
