"""Rollouts: TRL's ``environment_factory`` adapter with the episode trace and turn log
(``environment``) and which tokens belong to which turn (``segments``). Lowest layer of the
trainer; may import ``env_server``'s client and types."""
