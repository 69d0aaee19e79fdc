"""One module per memory technique; each puts itself on a model (or a step) and takes itself off again."""
