"""``python -m memlab`` runs the ``memlab`` command (see :mod:`memlab.frontends.cli.main`)."""

from memlab.frontends.cli.main import console_main

if __name__ == "__main__":
    console_main()
