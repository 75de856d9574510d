"""Credit assignment, numpy first: role samples (``role_samples``), reward shaping
(``shaping``), group normalisation (``group_norm``), GiGPO (``gigpo``, ``step_credit``,
``step_alignment``), user reward functions (``reward_functions``) and the advantage pipeline
(``advantages``) that turns graded records into ``(B, T)`` advantages, top to bottom."""
