"""Credit assignment, numpy first: the reward pipeline (``pipeline``) that turns graded records
into TRL's ``(B, T)`` advantages and loss mask, top to bottom, with what it calls: role samples
(``role_samples``), reward shaping (``shaping``), group normalisation (``group_norm``), GiGPO
(``gigpo``; its step inputs in ``step_credit`` and ``step_alignment``); user reward functions
(``reward_functions``) and the batch's metrics (``debate_metrics``, ``fidelity``)."""
