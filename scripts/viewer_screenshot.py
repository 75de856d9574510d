"""Produce ``docs/viewer.png``: the debate viewer (``/ui``) on a real server, in a real browser.

Starts ``mathdebate serve`` on a free port, plays three scripted debates over ``/ws/mux`` (a
wrong first answer that the verifier catches and the solver revises, a falsely accepted wrong
answer, a single-answer episode), opens ``/ui`` in headless Debian ``chromium`` driven by
Selenium through ``chromedriver`` (nothing is downloaded), clicks the first debate and, while a
background thread plays reference debates at a gentle pace (so the live panel shows steps/s),
saves a full-page screenshot.

    . .venv/bin/activate
    python scripts/viewer_screenshot.py                 # writes docs/viewer.png
    python scripts/viewer_screenshot.py --output /tmp/v.png --width 1440

Needs ``chromium`` and ``chromedriver`` on PATH (``apt-get install -y chromium chromium-driver``)
and ``selenium`` (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from env_server.cli import running_server
from env_server.client import SyncMuxClient
from env_server.debate.problems import ProblemGenerator

REPO = Path(__file__).resolve().parents[1]

#: (problem id, mode, turns); ``{answer}`` is replaced by the reference answer
DEBATES: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("gen/quadratic_roots/3", "debate", [
        ("solver", "Factor: $x^2 + 9x = x(x + 9)$, so the roots are $x = 0$ and $x = 9$.\n\\boxed{\\{0, 9\\}}"),
        ("verifier", "Check $x = 9$: $9^2 + 9 \\cdot 9 = 162 \\neq 0$, so $9$ is not a root; "
                     "the second factor gives $x + 9 = 0$.\nVERDICT: INCORRECT"),
        ("solver", "Right: $x(x + 9) = 0$ gives $x = 0$ or $x = -9$.\n\\boxed{{answer}}"),
        ("verifier", "$0$ and $(-9)^2 - 81 = 0$ both check out.\nVERDICT: CORRECT"),
        ("judge", "The revised answer is right: \\boxed{{answer}}"),
    ]),
    ("gen/fraction_arithmetic/1", "debate", [
        ("solver", "$\\frac{7}{9} \\times \\frac{4}{3} = \\frac{7 + 4}{9 + 3} = \\frac{11}{12}$, so \\boxed{\\frac{11}{12}}"),
        ("verifier", "Looks fine to me.\nVERDICT: CORRECT"),
        ("judge", "\\boxed{\\frac{11}{12}}"),
    ]),
    ("gen/derivative_at_point/5", "single", [
        ("solver", "$f'(x) = 15x^2 - 18x + 2$, so $f'(-2) = 60 + 36 + 2$ and the answer is \\boxed{{answer}}"),
    ]),
]


def play_debates(url: str) -> list[str]:
    """Play :data:`DEBATES` against ``url``; returns their episode ids, in order, once graded."""
    generator = ProblemGenerator()
    ids = []
    with SyncMuxClient(url) as client:
        session = client.open_session()
        for problem_id, mode, turns in DEBATES:
            answer = generator.get(problem_id).answer
            session.reset(problem_id=problem_id, mode=mode)
            for role, content in turns:
                session.step(role, content.replace("{answer}", answer))
            record = session.rewards(timeout_s=60)
            if record is None:
                raise RuntimeError(f"{problem_id}: not graded within 60 s")
            ids.append(record.episode_id)
    return ids


def background_load(url: str, stop: threading.Event, pause_s: float = 0.05) -> None:
    """Play reference debates one step every ``pause_s`` until ``stop`` is set."""
    generator = ProblemGenerator()
    with SyncMuxClient(url) as client:
        session = client.open_session()
        seed = 1000
        while not stop.is_set():
            problem = generator.by_seed(seed)
            seed += 1
            session.reset(problem_id=problem.problem_id)
            for role, content in [("solver", problem.solution), ("verifier", "VERDICT: CORRECT"),
                                  ("judge", f"\\boxed{{{problem.answer}}}")]:
                session.step(role, content)
                time.sleep(pause_s)


def chrome(width: int, height: int) -> Any:
    """Headless Debian chromium through the system chromedriver (Selenium Manager never runs)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)


def screenshot(url: str, episode_id: str, output: Path, width: int) -> None:
    """Open ``/ui``, click ``episode_id`` in the list, wait for its debate (and, under the
    background load, a non-zero steps/s) and save a full-page PNG."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chrome(width, 900)
    try:
        driver.get(f"{url}/ui")
        wait = WebDriverWait(driver, 30)
        row = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, f'tr[data-episode="{episode_id}"]')))
        row.click()
        wait.until(lambda d: d.find_element(By.ID, "debate").get_attribute("data-episode") == episode_id)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#obs-body .msg"))
        stop = threading.Event()
        load = threading.Thread(target=background_load, args=(url, stop), daemon=True)
        load.start()
        try:
            wait.until(lambda d: d.find_element(By.ID, "live-rate").text not in ("\u2013", "0.0"))
        finally:
            stop.set()
        for _ in range(3):  # grow the window to the page (the viewport is what gets captured)
            inner = driver.execute_script("return [window.innerHeight, document.documentElement.scrollHeight]")
            if inner[1] <= inner[0]:
                break
            driver.set_window_size(width, min(driver.get_window_size()["height"] + inner[1] - inner[0], 4000))
        output.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(output))
        load.join(timeout=30)
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> int:
    """Serve, play, screenshot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "viewer.png")
    parser.add_argument("--width", type=int, default=1440)
    args = parser.parse_args(argv)
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if missing:
        print(f"viewer_screenshot: {' and '.join(missing)} not on PATH (apt-get install -y chromium chromium-driver)",
              file=sys.stderr)
        return 2
    with running_server(["--grading-workers", "1"]) as url:
        ids = play_debates(url)
        screenshot(url, ids[0], args.output, args.width)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
