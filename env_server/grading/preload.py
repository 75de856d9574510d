"""Forkserver preload of the grading pool: import math-verify and warm it up once.

Every grading worker (and every replacement of a killed one) forks from the forkserver, so
what is imported and warmed here is paid once per server process instead of once per worker.
See :func:`env_server.grading.worker.warm_up`.
"""

from env_server.grading.worker import warm_up

warm_up()
