"""sft: a LoRA fine-tuned on good answers, demonstrations and hindsight answers."""
