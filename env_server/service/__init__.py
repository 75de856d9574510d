"""The service layer: ``DebateService`` (``facade``), the one object the transports use,
with its episode store, session registry, journal and recovery, finalisation and viewer
queries; ``ServerConfig`` (``config``). May import ``protocol``, ``debate``, ``grading``;
never a transport."""
