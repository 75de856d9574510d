"""The debate viewer: its routes and page (``routes``, ``ui/``) and ``mathdebate view``
(``command``). Reads episodes through an ``EpisodeSource``; may import ``transport.auth``."""
