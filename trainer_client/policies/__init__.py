"""Per-role policies: which policy generates and scores each role's turns (the config's
``policies`` section). ``settings`` (the section, torch-free), ``adapters`` (the roles' LoRA
adapters on one base, through PEFT), ``endpoint`` (a role played by an OpenAI-compatible
endpoint inside TRL's tool loop), ``routing`` (generation and log-probs routed by role at run
time), ``setup`` (what a training run builds from the section)."""
