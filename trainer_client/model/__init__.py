"""Forward passes over the policy model: batched response-only forwards (``forward``) and
the verifier's verdict probabilities (``verdict_probs``), and the weights' fingerprint
(``fingerprint``)."""
