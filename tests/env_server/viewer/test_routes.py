"""The debate viewer (issue 15) on real servers and real sockets: the JSON routes (shape,
filters, order, 404), the ``/ui`` page and its assets (CSP, no inline code, package data), the
auth cookie, ``mathdebate view`` on a trajectory file, and a real headless browser (Debian's
chromium through chromedriver and Selenium) reading debates whose text tries to inject HTML."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from env_server.cli import free_port, running_server
from env_server.client import SyncMuxClient
from env_server.debate.problems import Problem, ProblemGenerator
from env_server.protocol.markers import HINT_TEMPLATES
from env_server.protocol.models import EpisodeRewards
from env_server.transport.auth import viewer_credential
from env_server.viewer.command import TrajectoryFile
from env_server.viewer.routes import CONTENT_SECURITY_POLICY, ui_asset_names

REPO = Path(__file__).resolve().parents[3]
UI = REPO / "env_server" / "viewer" / "ui"
GENERATOR = ProblemGenerator()
TOKEN = "viewer-test-token"
SUMMARY_KEYS = {"episode_id", "problem_id", "mode", "episode_reward", "error_kinds", "turns", "graded_at"}

#: a solver turn that tries to inject markup, in text and inside a boxed answer
INJECTION = ("Careful: <script>alert(1)</script> and <img src=x onerror=alert(1)> and "
             "<img src=x onerror=window.pwned=1> stay text. Since $x^2 \\ge 0$ the answer is "
             "\\boxed{<img src=x onerror=alert(2)>}")


def fresh_problem(family: str) -> Problem:
    """A generated problem no other test plays (a random seed), so filters isolate it."""
    return GENERATOR.get(f"gen/{family}/{random.randrange(10**8, 10**9)}")


def play(url: str, debates: list[tuple[Problem, list[tuple[str, str]], str | None]],
         token: str | None = None) -> list[EpisodeRewards]:
    """Play each ``(problem, turns, mode)`` in order (``{answer}``: the reference answer); the
    graded records, in order."""
    records = []
    with SyncMuxClient(url, token=token) as client:
        session = client.open_session()
        for problem, turns, mode in debates:
            session.reset(problem_id=problem.problem_id, mode=mode)
            for role, content in turns:
                session.step(role, content.replace("{answer}", problem.answer))
            record = session.rewards(timeout_s=60)
            assert record is not None
            records.append(record)
    return records


def right(problem: Problem) -> tuple[Problem, list[tuple[str, str]], None]:
    return problem, [("solver", "so \\boxed{{answer}}"), ("verifier", "VERDICT: CORRECT"), ("judge", "\\boxed{{answer}}")], None


def injected(problem: Problem) -> tuple[Problem, list[tuple[str, str]], None]:
    """A wrong (unreadable) answer falsely accepted; the judge boxes nothing."""
    return problem, [("solver", INJECTION), ("verifier", "Fine.\nVERDICT: CORRECT"), ("judge", "I agree: \\boxed{}")], None


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def played(server_url) -> dict[str, Any]:
    """Three episodes on the shared server: right, injected (false accept), single mode."""
    problems = [fresh_problem("linear_equation"), fresh_problem("integer_arithmetic"), fresh_problem("gcd_lcm")]
    single = (problems[2], [("solver", "\\boxed{{answer}}")], "single")
    records = play(server_url, [right(problems[0]), injected(problems[1]), single])
    return {"url": server_url, "problems": problems, "records": records}


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """A server that requires ``TOKEN`` and writes a trajectory log."""
    log = tmp_path_factory.mktemp("viewer") / "trajectories.jsonl"
    with running_server(["--grading-workers", "1", "--trajectory-log", str(log)],
                        env={"MATHDEBATE_AUTH_TOKEN": TOKEN}) as url:
        yield url, log


@pytest.fixture(scope="module")
def trajectory_file(auth_server, tmp_path_factory) -> dict[str, Any]:
    """The auth server's real trajectory log of two debates, plus an evaluation-style line
    (``problem``, ``gold``, ``mode``, per-turn ``policy``) and a torn line."""
    url, log = auth_server
    records = play(url, [right(fresh_problem("finite_sum")), injected(fresh_problem("fraction_arithmetic"))], token=TOKEN)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["episode_id"] for line in lines] == [r.episode_id for r in records]
    problem = fresh_problem("modular_arithmetic")
    evaluation = {**lines[0], "episode_id": "eval-episode", "problem_id": problem.problem_id, "problem": problem.problem,
                  "gold": problem.answer, "mode": "debate", "strategy": "greedy", "chosen": True,
                  "turns": [{**turn, "policy": "scripted:reference", "messages": []} for turn in lines[0]["turns"]],
                  "rewards": {**lines[0]["rewards"], "episode_id": "eval-episode", "problem_id": problem.problem_id,
                              "graded_at": lines[-1]["rewards"]["graded_at"] + 1}}
    path = log.parent / "view.jsonl"
    path.write_text(log.read_text() + json.dumps(evaluation) + "\n" + '{"episode_id": "torn", "turns": [\n')
    return {"path": path, "records": records, "lines": lines, "eval_problem": problem}


@pytest.fixture(scope="module")
def view_url(trajectory_file) -> Iterator[str]:
    """``mathdebate view`` on the trajectory file, as a subprocess on a free port."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "env_server.cli", "view", str(trajectory_file["path"]),
                                "--port", str(port)], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if httpx.get(f"{url}/hints", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "mathdebate view did not start"
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


# --------------------------------------------------------------------------- JSON routes


def test_episode_list_filters_and_shape(played) -> None:
    url, problems, records = played["url"], played["problems"], played["records"]
    ids = [r.episode_id for r in records]

    def listed(**params: Any) -> list[dict[str, Any]]:
        response = httpx.get(f"{url}/episodes", params=params, timeout=10)
        assert response.status_code == 200, response.text
        return list(response.json()["episodes"])

    newest = [s["episode_id"] for s in listed(limit=1000) if s["episode_id"] in ids]
    assert newest == ids[::-1]  # most recently graded first
    (first,) = listed(problem_id=problems[0].problem_id)
    assert set(first) == SUMMARY_KEYS
    assert first == {"episode_id": ids[0], "problem_id": problems[0].problem_id, "mode": "debate", "episode_reward": 1.0,
                     "error_kinds": [], "turns": 3, "graded_at": records[0].graded_at}
    (wrong,) = listed(problem_id=problems[1].problem_id)
    kinds = list(dict.fromkeys(t.error_kind.value for t in records[1].turns if t.error_kind))
    assert wrong["error_kinds"] == kinds and "false_accept" in kinds and wrong["episode_reward"] == 0.0
    (single,) = listed(problem_id=problems[2].problem_id)
    assert single["mode"] == "single" and single["turns"] == 1
    assert [s["episode_id"] for s in listed(problem_id=problems[1].problem_id, error_kind="false_accept")] == [ids[1]]
    assert listed(problem_id=problems[0].problem_id, error_kind="false_accept") == []
    assert listed(problem_id=problems[1].problem_id, min_reward=0.5) == []
    assert len(listed(problem_id=problems[1].problem_id, max_reward=0.5)) == 1
    assert len(listed(problem_id=problems[0].problem_id, min_reward=1, max_reward=1)) == 1
    assert len(listed(limit=2)) == 2
    for bad in ({"error_kind": "nonsense"}, {"limit": 0}, {"limit": 1001}, {"min_reward": "x"}):
        assert httpx.get(f"{url}/episodes", params=bad, timeout=10).status_code == 422


def test_one_episode_in_full_and_404(played) -> None:
    url, problems, records = played["url"], played["problems"], played["records"]
    record = records[1]
    view = httpx.get(f"{url}/episodes/{record.episode_id}", timeout=10).json()
    assert view["problem_id"] == problems[1].problem_id and view["problem"] == problems[1].problem
    assert view["gold"] is None  # the live server never sends the reference answer
    assert view["mode"] == "debate" and view["done"] and view["graded"]
    assert [(t["t"], t["role"], t["round"]) for t in view["turns"]] == [(0, "solver", 0), (1, "verifier", 0), (2, "judge", 0)]
    assert view["turns"][0]["content"] == INJECTION
    assert EpisodeRewards.model_validate(view["rewards"]) == record
    assert view["max_t"] == 2
    # the page steps through observations with the existing state(t) route
    replay = httpx.get(f"{url}/state", params={"episode_id": record.episode_id, "t": view["max_t"]}, timeout=10)
    assert replay.status_code == 200 and replay.json()["observation"]["observation"]["role"] == "judge"
    assert httpx.get(f"{url}/state", params={"episode_id": record.episode_id, "t": 3}, timeout=10).status_code == 422
    # the rewards route is unchanged
    rewards = httpx.get(f"{url}/episodes/{record.episode_id}/rewards", timeout=10)
    assert rewards.status_code == 200 and rewards.json()["record"] == view["rewards"]
    missing = httpx.get(f"{url}/episodes/no-such-episode", timeout=10)
    assert missing.status_code == 404 and missing.json()["detail"]["code"] == "UNKNOWN_EPISODE"
    assert httpx.get(f"{url}/episodes/no-such-episode/rewards", timeout=10).status_code == 404


def test_openapi_documents_the_viewer_routes(server_url) -> None:
    paths = httpx.get(f"{server_url}/openapi.json", timeout=10).json()["paths"]
    assert {"/episodes", "/episodes/{episode_id}", "/episodes/{episode_id}/rewards", "/ui"} <= set(paths)
    assert not [p for p in paths if p.startswith("/ui/")]  # assets stay out of the schema
    parameters = {p["name"] for p in paths["/episodes"]["get"]["parameters"]}
    assert parameters == {"problem_id", "error_kind", "min_reward", "max_reward", "limit"}


# --------------------------------------------------------------------------- the page and its assets


def test_page_and_assets_carry_the_csp_and_no_inline_code(server_url) -> None:
    for name in ["", "/app.js", "/style.css", "/vendor/katex/katex.min.js", "/vendor/katex/katex.min.css",
                 "/vendor/katex/fonts/KaTeX_Main-Regular.woff2", "/vendor/katex/LICENSE"]:
        response = httpx.get(f"{server_url}/ui{name}", timeout=10)
        assert response.status_code == 200, name
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY == "default-src 'self'"
        assert response.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(f"{server_url}/ui", timeout=10).headers["content-type"].startswith("text/html")
    assert httpx.get(f"{server_url}/ui/app.js", timeout=10).headers["content-type"].startswith("text/javascript")
    for name in ["/nope.js", "/index.html", "/../service.py", "/%2e%2e/service.py", "/vendor/%2e%2e/%2e%2e/service.py"]:
        assert httpx.get(f"{server_url}/ui{name}", timeout=10).status_code == 404, name
    page = (UI / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "inline script"
    assert "<style" not in page and " style=" not in page and not re.search(r"\son[a-z]+=", page)
    assert not re.search(r"(?:src|href)=\"(?!/ui/)", page), "everything loads from /ui/"
    script = (UI / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, f"app.js uses {sink}"
    assert "trust: false" in script and "throwOnError: false" in script


def test_every_ui_file_is_package_data() -> None:
    """An installed wheel has the page: pyproject's package-data globs cover env_server/viewer/ui/."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["env_server"]
    files = ui_asset_names()
    assert {"index.html", "app.js", "style.css", "vendor/katex/katex.min.js", "vendor/katex/katex.min.css",
            "vendor/katex/LICENSE", "vendor/katex/fonts/KaTeX_Main-Regular.woff2"} <= set(files)
    package = REPO / "env_server"
    covered = {path.relative_to(UI).as_posix() for glob in globs if glob.startswith("viewer/ui/")
               for path in package.glob(glob) if path.is_file()}
    assert not set(files) - covered, f"not in [tool.setuptools.package-data]: {sorted(set(files) - covered)}"


def test_ui_token_sets_an_httponly_strict_cookie_that_auth_accepts(auth_server) -> None:
    url, _ = auth_server
    assert httpx.get(f"{url}/ui", timeout=10).status_code == 401
    assert httpx.get(f"{url}/ui", params={"token": "wrong"}, timeout=10).status_code == 401
    assert httpx.get(f"{url}/episodes", timeout=10).status_code == 401
    assert httpx.get(f"{url}/ui/app.js", timeout=10).status_code == 401
    response = httpx.get(f"{url}/ui", params={"token": TOKEN}, timeout=10)
    assert response.status_code == 200
    cookie = response.headers["set-cookie"]
    value = cookie.split(";")[0].split("=", 1)[1]
    # the cookie holds a credential derived from the token (HMAC-SHA256), never the token
    assert value == viewer_credential(TOKEN) and TOKEN not in cookie and len(value) == 64
    assert {"httponly", "samesite=strict", "path=/"} <= {part.strip().lower() for part in cookie.split(";")}
    with httpx.Client(base_url=url, headers={"Cookie": f"mathdebate_token={value}"}, timeout=10) as client:
        assert client.get("/episodes").status_code == 200
        assert client.get("/ui/app.js").status_code == 200
        assert client.get("/ui").status_code == 200 and "set-cookie" not in client.get("/ui").headers
        assert client.get("/stats").status_code == 200
        # reads only: the cookie cannot start or play an episode
        assert client.post("/reset", json={}).status_code == 401
        assert client.post("/step", json={"action": {"role": "solver", "content": "x"}}).status_code == 401
    for wrong in ("wrong", TOKEN):  # a cookie holding the token itself (earlier releases) no longer passes
        with httpx.Client(base_url=url, headers={"Cookie": f"mathdebate_token={wrong}"}, timeout=10) as client:
            assert client.get("/episodes").status_code == 401
    # the credential is not usable as a bearer token either
    assert httpx.get(f"{url}/episodes", headers={"Authorization": f"Bearer {value}"}, timeout=10).status_code == 401
    assert httpx.get(f"{url}/episodes", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).status_code == 200
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


# --------------------------------------------------------------------------- mathdebate view


def test_trajectory_file_reads_log_and_eval_lines(trajectory_file) -> None:
    source = TrajectoryFile(trajectory_file["path"])
    assert len(source) == 3 and source.skipped == [4]
    records, lines = trajectory_file["records"], trajectory_file["lines"]
    summaries = source.recent_episodes()
    assert [s["episode_id"] for s in summaries] == ["eval-episode", records[1].episode_id, records[0].episode_id]
    assert all(set(s) == SUMMARY_KEYS for s in summaries)
    assert [s["episode_id"] for s in source.recent_episodes(error_kind="false_accept")] == [records[1].episode_id]
    assert [s["episode_id"] for s in source.recent_episodes(min_reward=1, limit=1)] == ["eval-episode"]
    logged = source.episode_view(records[0].episode_id)
    problem = GENERATOR.get(lines[0]["problem_id"])
    assert (logged["problem"], logged["gold"]) == (problem.problem, problem.answer)  # from the generator
    assert logged["max_t"] is None and logged["mode"] == "debate"
    assert EpisodeRewards.model_validate(logged["rewards"]) == records[0]
    evaluation = source.episode_view("eval-episode")
    assert evaluation["gold"] == trajectory_file["eval_problem"].answer
    assert {t["policy"] for t in evaluation["turns"]} == {"scripted:reference"}


def test_mathdebate_view_serves_the_file(view_url, trajectory_file) -> None:
    records = trajectory_file["records"]
    episodes = httpx.get(f"{view_url}/episodes", timeout=10).json()["episodes"]
    assert [e["episode_id"] for e in episodes] == ["eval-episode", records[1].episode_id, records[0].episode_id]
    view = httpx.get(f"{view_url}/episodes/{records[1].episode_id}", timeout=10).json()
    assert view["turns"][0]["content"] == INJECTION and view["max_t"] is None
    assert EpisodeRewards.model_validate(view["rewards"]) == records[1]
    assert httpx.get(f"{view_url}/episodes/torn", timeout=10).status_code == 404
    assert httpx.get(f"{view_url}/hints", timeout=10).json() == HINT_TEMPLATES
    page = httpx.get(f"{view_url}/ui", timeout=10)
    assert page.status_code == 200 and page.headers["content-security-policy"] == "default-src 'self'"
    assert httpx.get(f"{view_url}/stats", timeout=10).status_code == 404  # the page hides its live panel
    assert httpx.get(f"{view_url}/state", timeout=10).status_code == 404


def test_mathdebate_view_reports_a_missing_file(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "env_server.cli", "view", str(tmp_path / "none.jsonl")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "none.jsonl" in done.stderr


# --------------------------------------------------------------------------- a real browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian chromium through the system chromedriver (Selenium Manager never runs)."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if missing:
        why = f"{' and '.join(missing)} not on PATH (apt-get install -y chromium chromium-driver)"
        # scripts/test.sh installs both where it can (root with apt-get): in CI a missing browser
        # there is a broken install, not a reason to skip
        if os.environ.get("CI") == "true" and os.geteuid() == 0 and shutil.which("apt-get"):
            pytest.fail(f"{why}; scripts/test.sh should have installed them")
        pytest.skip(why)
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _open_debate(driver: Any, url: str, episode_id: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    wait = WebDriverWait(driver, 30)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, f'tr[data-episode="{episode_id}"] td.problem-id'))).click()
    wait.until(lambda d: d.find_element(By.ID, "debate").get_attribute("data-episode") == episode_id)


def _csp_violations(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]


def test_browser_reads_a_debate_with_markers_hints_rewards_and_no_injection(browser, played, tmp_path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver, url = browser, played["url"]
    record = played["records"][1]
    _open_debate(driver, f"{url}/ui", record.episode_id)
    wait = WebDriverWait(driver, 30)
    # the problem and the turns, with KaTeX-rendered math
    assert driver.find_element(By.ID, "d-problem").text.strip() != ""
    assert driver.find_elements(By.CSS_SELECTOR, "#d-problem .katex")
    turns = driver.find_elements(By.CSS_SELECTOR, "#d-turns > li")
    assert [t.find_element(By.CSS_SELECTOR, ".role").text.lower() for t in turns] == ["solver", "verifier", "judge"]
    # the injected markup is shown as text and nothing was injected or run
    solver = turns[0].find_element(By.CSS_SELECTOR, ".content")
    assert "<script>alert(1)</script>" in solver.text and "<img src=x onerror=alert(1)>" in solver.text
    assert solver.find_elements(By.CSS_SELECTOR, ".katex")  # $x^2 \ge 0$ and the boxed "answer"
    assert driver.find_elements(By.CSS_SELECTOR, "#debate img, #debate script, #debate iframe, #debate svg[onload]") == []
    assert driver.execute_script("return document.images.length") == 0
    assert len(driver.find_elements(By.TAG_NAME, "script")) == 2  # KaTeX and app.js
    assert driver.execute_script("return window.pwned === undefined")
    with pytest.raises(NoAlertPresentException):
        _ = driver.switch_to.alert.text
    # per-turn rewards, correctness, markers with their hint text, the error site
    rewards = [t.find_element(By.CSS_SELECTOR, ".reward-value").text for t in turns]
    assert rewards == [f"reward {r.reward:g}" for r in record.turns]
    assert "verdict wrong" in turns[1].find_element(By.CSS_SELECTOR, ".correct").text
    for item, turn in zip(turns, record.turns, strict=True):
        markers = item.find_elements(By.CSS_SELECTOR, ".marker")
        assert bool(markers) == (turn.error_kind is not None)
        if turn.error_kind is not None:
            assert turn.error_kind.value in markers[0].find_element(By.CSS_SELECTOR, ".kind").text
            if turn.hint_template_key in HINT_TEMPLATES:
                assert markers[0].find_element(By.CSS_SELECTOR, ".hint").text == HINT_TEMPLATES[turn.hint_template_key]
    assert turns[1].find_element(By.CSS_SELECTOR, "mark.error-site").text == "VERDICT: CORRECT"  # the false accept
    # the final reward and the counterfactual facts
    assert driver.find_element(By.ID, "d-reward").text == f"{record.episode_reward:g}"
    facts = driver.find_element(By.ID, "d-facts").text
    assert "first answer correct" in facts and "rewards without role" in facts
    # stepping through observations with GET /state?episode_id=&t=
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#obs-body .msg"))
    assert driver.find_element(By.ID, "obs-label").text.startswith("t = 0")
    driver.find_element(By.ID, "obs-next").click()
    wait.until(lambda d: d.find_element(By.ID, "obs-label").text.startswith("t = 1"))
    wait.until(lambda d: "verifier" in d.find_element(By.CSS_SELECTOR, "#obs-body .obs-summary").text)
    assert "stepping" in turns[1].get_attribute("class")
    assert INJECTION in driver.find_element(By.ID, "obs-body").text  # the verifier saw the solver's turn, as text
    # the live panel (two /stats readings give steps/s)
    wait.until(lambda d: d.find_element(By.ID, "live").is_displayed())
    wait.until(lambda d: d.find_element(By.ID, "live-rate").text != "\u2013")
    assert int(driver.find_element(By.ID, "live-graded").text) >= 3
    # KaTeX's fonts loaded under the CSP, and the CSP blocked nothing the page does
    assert driver.execute_async_script(
        "const done = arguments[0]; document.fonts.ready.then(() => done("
        "[...document.fonts].some((f) => f.family.includes('KaTeX_Main') && f.status === 'loaded')));")
    assert _csp_violations(driver) == []
    shot = tmp_path / "viewer.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_browser_filters_the_list(browser, played) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver, url, problems = browser, played["url"], played["problems"]
    driver.get(f"{url}/ui")
    wait = WebDriverWait(driver, 30)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    form = driver.find_element(By.ID, "filters")
    form.find_element(By.NAME, "problem_id").send_keys(problems[1].problem_id)
    Select(form.find_element(By.NAME, "error_kind")).select_by_value("false_accept")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == 1)
    row = driver.find_element(By.CSS_SELECTOR, "#episodes tbody tr")
    assert row.get_attribute("data-episode") == played["records"][1].episode_id
    form.find_element(By.NAME, "min_reward").send_keys("1")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: d.find_element(By.ID, "empty").is_displayed())


def test_browser_cookie_flow(browser, auth_server) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver, (url, _) = browser, auth_server
    driver.get(f"{url}/ui?token={TOKEN}")
    wait = WebDriverWait(driver, 30)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    assert "token" not in driver.current_url  # the page drops it from the address bar
    assert not driver.find_element(By.ID, "error").is_displayed()  # its own requests passed on the cookie
    wait.until(lambda d: d.find_element(By.ID, "live").is_displayed())
    cookie = driver.get_cookie("mathdebate_token")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert driver.execute_script("return document.cookie") == ""  # not readable by scripts


def test_browser_on_mathdebate_view(browser, view_url, trajectory_file) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    _open_debate(driver, f"{view_url}/ui", "eval-episode")
    assert not driver.find_element(By.ID, "live").is_displayed()  # no /stats offline
    assert not driver.find_element(By.ID, "d-obs").is_displayed()  # no state(t) offline
    assert driver.find_element(By.ID, "d-gold").is_displayed()
    assert driver.find_elements(By.CSS_SELECTOR, "#d-turns .policy")[0].text == "scripted:reference"
    assert _csp_violations(driver) == []


def test_screenshot_script_is_runnable() -> None:
    """``scripts/viewer_screenshot.py`` (it writes docs/viewer.png) parses its arguments."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "viewer_screenshot.py"), "--help"],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and "--output" in done.stdout
