"""Running requests under a release: bindings, and a model to run them on.

The layer below `evaluation`, `releases` and `learning`: a `Binding` says how a release changes a
request (a harness's prompt, examples and settings, or a LoRA adapter), and a `Model` runs a
request under a binding, on the engine in this process or on the running server's engine.
"""
