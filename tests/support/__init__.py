"""Code the tests load by name (python scorers) or share (GGUF adapters, harness folders)."""
