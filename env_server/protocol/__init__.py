"""The wire and domain types, lowest layer of the server: roles, error kinds and modes
(``markers``), pydantic wire/domain models (``models``), typed refusals (``errors``), grades
(``grades``), wire envelopes (``frames``) and stored payloads (``payloads``). Imports nothing
above it."""
