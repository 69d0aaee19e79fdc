"""The runner: a session on a live model that runs plans (training or inference workloads), the training step it
runs, and what it captures and restores. ``memlab.measure``/``compare``/``apply`` live here."""
