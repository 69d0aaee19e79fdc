"""``python -m memlab`` runs the ``memlab`` command (see :mod:`memlab.cli`)."""

from memlab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
