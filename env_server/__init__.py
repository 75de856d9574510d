"""mathdebate's environment server: the math-debate environment behind the OpenEnv wire
protocol (HTTP and ``/ws``) and its extensions (``/ws/mux``, error-site markers, delayed
rewards, ``state(t)`` replay). Never imports torch."""

__version__ = "0.1.0"
