"""How soon the page shows a speaker's first words: its live mode in Debian's headless Chromium.

    python -m bench.page_live [--out bench/results/page-live-DATE.json]

Chromium's fake microphone plays a WAV from the moment the page opens it: LEAD_S of silence,
the ~10 s utterance of bench.realtime_latency, then silence. The page's WebSocket is watched
(wrapped before the page's scripts run) for when its first audio frame goes out, and the
transcript for when a line first shows text and when its final text comes. Speech starts
LEAD_S after the first frame, give or take the capture's own buffering (tens of ms).
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from support.server_process import ServerProcess

from .realtime_latency import long_utterance

LEAD_S = 1.0

# Before the page's own scripts: note (performance.now(), ms) the first audio frame sent, the
# first text of an unfinished line, and the first finished line.
WATCH = """
window.marks = {};
const send = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) {
  if (window.marks.firstFrame === undefined && String(data).includes('input_audio_buffer.append'))
    window.marks.firstFrame = performance.now();
  return send.call(this, data);
};
document.addEventListener('DOMContentLoaded', () => new MutationObserver(() => {
  const partial = document.querySelector('#transcript li.partial .text');
  if (window.marks.firstText === undefined && partial && partial.textContent)
    window.marks.firstText = performance.now();
  if (window.marks.final === undefined && document.querySelector('#transcript li.final'))
    window.marks.final = performance.now();
}).observe(document.getElementById('transcript'), {subtree: true, childList: true, characterData: true}));
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(f"bench/results/page-live-{datetime.date.today()}.json"))
    args = parser.parse_args()
    speech = long_utterance()
    wav = Path(tempfile.mkdtemp(prefix="page-live-")) / "speech.wav"
    silence = np.zeros(int(LEAD_S * 16000), dtype=np.float32)
    sf.write(wav, np.concatenate([silence, speech, silence, silence, silence]), 16000, subtype="PCM_16")
    server = ServerProcess("--threads", "2")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900",
                 "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                 f"--use-file-for-fake-audio-capture={wav}", "--autoplay-policy=no-user-gesture-required"):
        options.add_argument(flag)
    driver = None
    try:
        server.wait_ready()
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH})
        driver.get(server.url + "/")
        driver.find_element(By.ID, "record").click()
        deadline = time.monotonic() + 60
        marks: dict = {}
        while time.monotonic() < deadline and "final" not in marks:
            time.sleep(0.1)
            marks = driver.execute_script("return window.marks")
        final_text = driver.find_element(By.CSS_SELECTOR, "#transcript li.final .text").text
    finally:
        if driver is not None:
            driver.quit()
        server.stop()
    speech_start = marks["firstFrame"] / 1000 + LEAD_S
    speech_end = speech_start + len(speech) / 16000
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "speech_seconds": round(len(speech) / 16000, 2),
              "first_text_after_speech_start_s": round(marks["firstText"] / 1000 - speech_start, 2),
              "final_after_speech_end_s": round(marks["final"] / 1000 - speech_end, 2), "final_text": final_text}
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    print(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
