"""Does the page stay responsive on a long file? The workbench in Debian's headless Chromium on
a 30-minute many-voiced recording, diarized.

    python -m bench.page_long_file [--minutes 30] [--out bench/results/page-long-file-DATE.json]

Starts a real `asr-service serve` (uploads up to 100 MB: the WAV is 16-bit PCM), builds the
recording from support/speakers.py's four-voice conversation repeated, uploads it through the
page with "Who spoke when" ticked, and reports: when the first text showed and the result came,
what was rendered, and the page's main-thread stalls (the gaps between 50 ms timer ticks) while
it decoded and rendered, then while it played from near the end.
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
from support.speakers import build

# The page's main thread is sampled by a 50 ms timer; a gap between ticks is a stall.
WATCH_STALLS = """window.gaps = []; let last = performance.now();
    setInterval(() => { const now = performance.now(); window.gaps.push(now - last); last = now; }, 50);"""


def recording(minutes: float, folder: Path) -> Path:
    talk, _ = build(short=True)
    samples = int(minutes * 60 * 16000)
    path = folder / "meeting.wav"
    sf.write(path, np.tile(talk, samples // talk.shape[0] + 1)[:samples], 16000, subtype="PCM_16")
    return path


def stalls(driver) -> dict:
    gaps = sorted(driver.execute_script("const g = window.gaps; window.gaps = []; return g"))
    return {"longest_ms": round(gaps[-1]), "p99_ms": round(gaps[int(len(gaps) * 0.99)]), "ticks": len(gaps)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--out", type=Path, default=Path(f"bench/results/page-long-file-{datetime.date.today()}.json"))
    args = parser.parse_args()
    path = recording(args.minutes, Path(tempfile.mkdtemp(prefix="page-bench-")))
    server = ServerProcess("--threads", "2", "--max-bytes", "100000000")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900",
                 "--autoplay-policy=no-user-gesture-required"):
        options.add_argument(flag)
    driver = None
    try:
        server.wait_ready()
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        driver.get(server.url + "/")
        driver.execute_script(WATCH_STALLS)
        driver.find_element(By.ID, "file").send_keys(str(path))
        driver.find_element(By.ID, "diarize").click()
        start = time.monotonic()
        driver.find_element(By.CSS_SELECTOR, "#upload button[type=submit]").click()
        first_text = None
        while time.monotonic() - start < 1800:
            status = driver.find_element(By.ID, "file-status").text
            if first_text is None and driver.find_element(By.ID, "progress-text").text:
                first_text = time.monotonic() - start
            if status == "Done." or "Error" in status:
                break
            time.sleep(1)
        report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "audio_minutes": args.minutes,
                  "status": status, "first_text_s": round(first_text or -1, 1),
                  "result_s": round(time.monotonic() - start, 1), "decoding_and_rendering": stalls(driver)}
        report["rendered"] = driver.execute_script("""return {words: document.querySelectorAll('.word[data-index]').length,
            segments: document.querySelectorAll('#blocks .block').length,
            speakers: document.querySelectorAll('#legend li').length}""")
        driver.execute_script("const p = document.getElementById('player'); p.currentTime = p.duration - 300; p.play()")
        time.sleep(3)
        report["playing"] = {"at_s": round(driver.execute_script("return document.getElementById('player').currentTime"), 1),
                             "word": int(driver.find_element(By.ID, "file-transcript").get_attribute("data-current-word")),
                             **stalls(driver)}
    finally:
        if driver is not None:
            driver.quit()
        server.stop()
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
