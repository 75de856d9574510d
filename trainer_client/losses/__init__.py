"""The loss channels beside GRPO, behind one contract (``base.LossChannel``): hint
distillation (SDPO) and trace-replay DPO with its teachers and pair store; the loss
functions themselves in ``functional``."""
