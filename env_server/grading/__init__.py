"""Grading answers: the pool with its fast paths, cache and hard-killed workers (``pool``),
the worker's math-verify policies (``worker``) and the forkserver preload (``preload``).
May import ``protocol`` and ``debate``."""
