"""sdft: self-distillation fine-tuning, from demonstrations, on the model's own answers."""
