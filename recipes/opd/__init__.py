"""opd: on-policy distillation from a frozen teacher, on the model's own answers."""
