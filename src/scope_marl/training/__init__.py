"""Learning from rollouts: GRPO-family losses and per-role LoRA learners."""
