"""``python -m memlab`` runs the ``memlab`` command (see :mod:`memlab.frontends.cli`)."""

from memlab.frontends.cli import console_main

if __name__ == "__main__":
    console_main()
