"""The compiled hot path (``setup.py``, ``MATHDEBATE_MYPYC=1``): the wheel builds with mypyc, the
installed server imports the compiled modules, and it plays the same debates to the same
records as the pure-Python server (same problems, same actions; ids and times aside), bad frames
included."""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from env_server.cli import free_port, running_server
from env_server.client import MuxClient
from env_server.debate.problems import ProblemGenerator

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ProblemGenerator()


def _hot_path() -> list[str]:
    """setup.py's HOT_PATH, as module names (read from the file, not run)."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "HOT_PATH" for t in node.targets):
            return [path.removesuffix(".py").replace("/", ".") for path in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no HOT_PATH")


@pytest.fixture(scope="module")
def compiled_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = tmp_path_factory.mktemp("wheels")
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "MATHDEBATE_MYPYC": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps", str(ROOT),
                    "-w", str(wheels)], env=env, check=True, cwd=ROOT)
    (wheel,) = wheels.glob("mathdebate-*.whl")
    assert "cp3" in wheel.name and "linux" in wheel.name  # a platform wheel: it holds extensions
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True)
    return site


@pytest.mark.slow
@pytest.mark.timeout(600)  # its fixture compiles the wheel: 90 s alone, 200 s beside two other test workers
def test_the_installed_server_imports_the_compiled_modules(compiled_site: Path) -> None:
    modules = _hot_path()
    assert len(modules) >= 10
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    print(importlib.import_module(name).__file__)"
    out = subprocess.run([sys.executable, "-c", code, *modules], env={**os.environ, "PYTHONPATH": str(compiled_site)},
                         capture_output=True, text=True, check=True, cwd="/").stdout.split()
    assert len(out) == len(modules)
    for path in out:
        assert path.startswith(str(compiled_site)) and path.endswith(".so"), path


#: (seed, solver turns, verifier turns, judge) per debate: right, wrong then fixed, no box, rejected twice
DEBATES: list[tuple[int, list[str], list[str], str]] = [
    (1, ["\\boxed{ANSWER}"], ["Fine. VERDICT: CORRECT"], "\\boxed{ANSWER}"),
    (2, ["\\boxed{-999}", "Fixed: \\boxed{ANSWER}"], ["Step 2 is wrong. VERDICT: INCORRECT", "VERDICT: CORRECT"],
     "\\boxed{ANSWER}"),
    (3, ["I am not sure.", "Still not sure."], ["No answer given. VERDICT: INCORRECT", "VERDICT: INCORRECT"],
     "\\boxed{7}"),
    (4, ["\\boxed{1/3}", "\\boxed{1/3}"], ["VERDICT: INCORRECT", "VERDICT: INCORRECT"], "\\boxed{ANSWER}"),
]


def _strip(value: Any) -> Any:
    """The record without what differs by run (ids, times)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in ("episode_id", "session_id", "graded_at")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


async def _play(url: str) -> list[Any]:
    out: list[Any] = []
    async with MuxClient(url) as client:
        session = await client.open_session()
        for seed, solver, verifier, judge in DEBATES:
            problem = GENERATOR.by_seed(seed)
            await session.reset(problem_id=problem.problem_id)
            observations = []
            for i, text in enumerate(solver):
                result = await session.step("solver", text.replace("ANSWER", problem.answer))
                observations.append(result.observation.role)
                if result.observation.role == "verifier":
                    result = await session.step("verifier", verifier[i])
                    observations.append(result.observation.role)
                if result.observation.role == "judge":
                    break
            result = await session.step("judge", judge.replace("ANSWER", problem.answer))
            assert result.done
            record = await session.rewards(wait=True)
            out.append([observations, _strip(record.model_dump(mode="json"))])
    # bad frames: each gets its error frame, the connection keeps serving
    async with connect(url.replace("http", "ws") + "/ws/mux?batch=1") as ws:
        await ws.send(b'[{"type":"step","request_id":1,"session_id":"nope","data":{"role":"solver","content":"x"}},'
                      b'{"type":"warp","request_id":2},{"type":"step","request_id":3},'
                      b'{"type":"ping","request_id":1180591620717411303424},{"type":"ping","request_id":4}]')
        replies = orjson.loads(await ws.recv())
        out.append([(r["type"], r["request_id"], (r.get("data") or {}).get("code")) for r in replies])
    return out


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/stats", timeout=10) as response:
        return dict(orjson.loads(response.read()))


def _serves(proc: Path, port: int) -> bool:
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"serve" in argv and str(port).encode() in argv


def test_the_compiled_server_plays_as_the_pure_one(compiled_site: Path) -> None:
    with running_server(["--grading-workers", "1"]) as url:
        pure = asyncio.run(_play(url))
        pure_stats = _stats(url)
    port = free_port()
    with running_server(["--grading-workers", "1"], port=port, env={"PYTHONPATH": str(compiled_site)},
                        cwd=str(compiled_site)) as url:
        (pid,) = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _serves(p, port)]
        mapped = (Path("/proc") / pid / "maps").read_text()
        assert f"{compiled_site}/env_server/transport/mux.cpython" in mapped  # the compiled modules serve
        compiled = asyncio.run(_play(url))
        compiled_stats = _stats(url)
    assert compiled == pure
    assert [stats["compiled"] for stats in (pure_stats, compiled_stats)] == [False, True]  # /stats says which
    rewards = [record["episode_reward"] for _, record in pure[:-1]]
    assert rewards == [1.0, 1.0, 0.0, 1.0]
    assert [code for _, _, code in pure[-1]][:3] == ["UNKNOWN_SESSION", "UNKNOWN_TYPE", "VALIDATION_ERROR"]
    assert pure[-1][-1][0] == "pong"
