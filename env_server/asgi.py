"""The ASGI entry point OpenEnv's package layout names: ``app`` (``openenv.yaml``:
``app: env_server.asgi:app``, also ``uvicorn env_server.asgi:app``) and ``main()``.

Both only point at the real modules: ``app`` is :func:`env_server.app.create_app` with the
default :class:`~env_server.service.config.ServerConfig` (the built-in problem generator;
``MATHDEBATE_AUTH_TOKEN`` is honoured), built at import time without starting anything (the
grading pool starts with the app's lifespan); ``main()`` is ``mathdebate serve`` with the
command line's arguments, the way to run the server with options.
"""

from __future__ import annotations

import sys

from env_server.app import create_app

__all__ = ["app", "main"]

app = create_app()


def main() -> None:
    """``mathdebate serve`` with ``sys.argv[1:]`` (e.g. ``--port 8000 --problems PATH``)."""
    from env_server.cli import main as cli_main

    sys.exit(cli_main(["serve", *sys.argv[1:]]))
