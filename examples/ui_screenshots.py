"""Screenshots of the server's pages for docs/server.md, taken in headless Chromium.

    python examples/ui_screenshots.py                       # the built-in pair
    python examples/ui_screenshots.py --model M --draft D --out docs/img

Starts `dflash-mlx serve` on a free port, opens the chat page and sends a message
there (chat.png), then sends the server a few chat requests, two at a time, so that
the dashboard has a batch, a plot and a requests table to show (dashboard.png, taken
while more run). Each PNG is reduced to a palette of 128 colours where it would pass
150 KB.

Needs Chromium and its driver (Debian: `apt-get install chromium chromium-driver`;
nothing is downloaded) and `selenium` (the `test` extra). `headless_chromium` is
also what the browser tests (tests/test_serve_ui_browser.py) drive.
"""

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

MAX_PNG_BYTES = 150_000


def find_chromium() -> tuple[str, str] | None:
    """(browser, driver) paths of the system's Chromium, or None where there is none.
    $CHROMIUM and $CHROMEDRIVER name others."""
    browser = os.environ.get("CHROMIUM") or next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None
    )
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def headless_chromium(width: int = 1280, height: int = 900):
    """A Selenium driver of the system's headless Chromium (no download: the driver's
    path is given, so Selenium Manager never runs)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    if found is None:
        raise RuntimeError(
            "No Chromium here: install it (Debian: apt-get install chromium "
            "chromium-driver) or name it with $CHROMIUM and $CHROMEDRIVER."
        )
    browser, driver = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    # the suite preloads OpenBLAS (LD_PRELOAD, see the Makefile): Chromium's renderer
    # crashes with it
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return webdriver.Chrome(service=Service(driver, env=env), options=options)


def small_png(png: bytes) -> bytes:
    """`png` as it is, or palette-quantized when it passes MAX_PNG_BYTES."""
    if len(png) <= MAX_PNG_BYTES:
        return png
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    for colours in (128, 64, 32):
        out = io.BytesIO()
        image.quantize(colours).save(out, "PNG", optimize=True)
        if out.tell() <= MAX_PNG_BYTES:
            break
    return out.getvalue()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="target (default: the built-in one)")
    p.add_argument("--draft", help="DFlash drafter (default: the target's)")
    p.add_argument("--out", default="docs/img", help="folder for the PNGs")
    p.add_argument("--width", type=int, default=1280)
    return p.parse_args()


def start_server(args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "dflash_mlx.cli.main", "serve", "--port", "0"]
    cmd += ["--max-tokens", "200"]
    if args.model:
        cmd += ["--model", args.model]
    if args.draft:
        cmd += ["--draft", args.draft]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="")
        found = re.search(r"Ready at (http://\S+)/v1", line)
        if found:
            return proc, found.group(1)
    raise SystemExit("the server did not start")


QUESTIONS = [
    "Write a Python function that checks whether a number is prime.",
    "What is 17 * 23? Explain step by step.",
    "Give three tips for writing clear commit messages.",
    "Explain what a hash map is in two sentences.",
]


def load(url: str):
    """A few requests, two at a time: the dashboard's plot and table fill."""
    import httpx

    def ask(q):
        body = {"messages": [{"role": "user", "content": q}], "max_tokens": 160}
        try:
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
        except httpx.TransportError:  # the server stopped: the screenshots are done
            pass

    threads = [threading.Thread(target=ask, args=(q,)) for q in QUESTIONS]
    for pair in (threads[:2], threads[2:]):
        for t in pair:
            t.start()
        for t in pair:
            t.join()


def main():
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    proc, url = start_server(args)
    driver = headless_chromium(args.width, 900)
    try:
        driver.get(url + "/chat")
        wait = WebDriverWait(driver, 600)
        wait.until(
            lambda d: (
                d.find_element(By.ID, "conn").get_attribute("data-state") == "live"
            )
        )
        box = driver.find_element(By.ID, "input")
        box.send_keys(
            "Write a short Python function that reverses a string, "
            "then show how to call it."
        )
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .engine"))
        time.sleep(0.5)
        shoot(driver, out / "chat.png")
        load(url)
        threading.Thread(target=load, args=(url,), daemon=True).start()
        driver.get(url + "/")
        time.sleep(4)  # mid-load: requests running, the plot moving
        shoot(driver, out / "dashboard.png", full=True)
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(60)


def shoot(driver, path: Path, full: bool = False):
    """A PNG of the page (`full`: as tall as its content) at most MAX_PNG_BYTES."""
    if full:
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(driver.get_window_size()["width"], min(height, 2400))
        time.sleep(0.3)
    png = small_png(driver.get_screenshot_as_png())
    path.write_bytes(png)
    print(f"{path}: {len(png) // 1000} KB")


if __name__ == "__main__":
    main()
