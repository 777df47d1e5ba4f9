"""Code the tests load by name, such as python scorers."""
