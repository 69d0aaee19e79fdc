"""``python -m memlab`` runs the ``memlab`` command (see :mod:`memlab.frontends.cli`)."""

from memlab.frontends.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
