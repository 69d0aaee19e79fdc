"""Front ends: the CLI (``memlab demo``, ``memlab estimate``) and the Jupyter layer (``jupyter/``). They build
Plans and options, call the core and render its events; the core never imports them."""
