"""Convert transforms, one rewrite each; `pipeline.py` composes them per target."""
