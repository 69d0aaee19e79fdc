"""The browser tests' fixtures (a Jupyter server, headless Chromium: :mod:`browser_lab`), shared by every
test_browser*.py module here."""

from browser_lab import chromium, jupyter_server, lab, lab_with_memfit_and_panel  # noqa: F401
