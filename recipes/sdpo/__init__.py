"""sdpo: self-distillation from the model's own correct attempts at the same prompt."""
