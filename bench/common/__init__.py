"""What the benchmarks share: where figures go (results.py), the stand-in for a capable model
(taught.py), the preferences and their rounds (preferences.py), llama.cpp's own decode
ceiling (ceilings.py) and the weight formats' copies (formats.py)."""
