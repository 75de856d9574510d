"""The wire: ``/ws/mux`` (``mux``), OpenEnv ``/ws`` (``openenv_ws``), OpenEnv's HTTP routes
(``routes_openenv``), the extension routes (``routes_extensions``), the WebSocket routes
(``routes_ws``) and bearer tokens (``auth``). Talks to the service only."""
