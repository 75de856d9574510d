"""Build hook (everything else is in ``pyproject.toml``): the env server's hot path, compiled.

``MATHDEBATE_MYPYC=1`` compiles the modules in :data:`HOT_PATH` to C extensions with mypyc
(mypy's compiler, the way mypy and black ship); the ``.py`` sources stay in the wheel and
every other module stays pure Python. The compiled modules took about 0.8x the server CPU per step
of the pure ones on ``/ws/mux`` (``benchmarks/README.md``, "Compiled hot path"). Without the
variable the wheel is pure Python, as before. mypyc needs mypy at build time, so build without
isolation, with the mypy the dev extra pins and a C compiler::

    pip install "mypy==2.4.1" "setuptools>=77" wheel
    MATHDEBATE_MYPYC=1 pip install --no-build-isolation .

Why these modules: the episode's step, the observation and record building, the mux frame
path and the session/episode tables are where a loaded server's time goes (the py-spy profiles
in ``benchmarks/README.md``); ``grading/pool.py`` is left out (mypyc 2.4.1 emits C for it
that does not compile).
"""

from __future__ import annotations

import os

from setuptools import setup

#: the modules compiled with ``MATHDEBATE_MYPYC=1`` (``tests/env_server/test_compiled_build.py``
#: builds and serves them)
HOT_PATH = [
    "env_server/debate/answers.py",
    "env_server/debate/prompts.py",
    "env_server/debate/episode.py",
    "env_server/debate/rewards.py",
    "env_server/protocol/frames.py",
    "env_server/service/facade.py",
    "env_server/service/finalisation.py",
    "env_server/service/episodes.py",
    "env_server/service/sessions.py",
    "env_server/service/ids.py",
    "env_server/transport/mux.py",
]

ext_modules = []
if os.environ.get("MATHDEBATE_MYPYC") == "1":
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        raise SystemExit(
            "MATHDEBATE_MYPYC=1 needs mypy (mypyc) where the wheel is built: "
            'pip install "mypy==2.4.1" and build with --no-build-isolation'
        ) from exc
    ext_modules = mypycify(HOT_PATH, opt_level="3")

setup(ext_modules=ext_modules)
