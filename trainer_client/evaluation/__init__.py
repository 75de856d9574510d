"""Evaluating a policy: ``mathdebate eval`` (debates or single answers on a problem set with any
policy), and the held-out measurements of a trained model that ``train`` and ``ablate`` report.

- :mod:`~trainer_client.evaluation.policies`: the :class:`Policy` interface and the policy
  specs (``scripted:reference``, ``scripted:noisy:P``, ``hf:PATH``, ``openai:URL#MODEL``);
- :mod:`~trainer_client.evaluation.hf_policy`: a local transformers model in the tool-call
  format it was trained in (the code the held-out evaluation uses);
- :mod:`~trainer_client.evaluation.openai_policy`: any OpenAI-compatible chat-completions
  endpoint (``vllm serve``, a hosted API), with bounded concurrency, timeouts and retries;
- :mod:`~trainer_client.evaluation.selection`: best-of-N and self-consistency choices;
- :mod:`~trainer_client.evaluation.runner`: episodes against the env server, per strategy;
- :mod:`~trainer_client.evaluation.results`: aggregates, ``results.json``, ``trajectories.jsonl``
  and the summary table;
- :mod:`~trainer_client.evaluation.command`: the command line;
- :mod:`~trainer_client.evaluation.heldout`: held-out first answers of a local model, one code path
  for every measurement; :mod:`~trainer_client.evaluation.episode_eval`: whole debates played by one
  model against the server's episode code; :mod:`~trainer_client.evaluation.policy_eval`: every
  figure of one policy on one problem set (what ``ablate`` reports before and after training).
"""
