"""memlab's Jupyter front ends: the ``%%memfit`` magic, the widget panel and the live figure.

This package is the only part of memlab that imports IPython, ipywidgets, anywidget and plotly's widgets;
``import memlab`` never imports it.
"""
