"""Writing SVG by hand: a list of elements in drawing order (:class:`Svg`), and the numbers and words they show.

Nothing here knows what a memlab figure is; :mod:`memlab.report.views.svg.panels` and
:mod:`memlab.report.views.svg.layout`
draw one with it. Coordinates are written to a tenth of a pixel (:func:`px`), text widths are estimated
(:func:`memlab.report.views.plan_axis.text_width`), never measured.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

from memlab.report.views.plan_axis import text_width

__all__ = ["FONT", "Svg", "axis_number", "bold_width", "escape", "nice_ticks", "px", "wrap"]

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
"""The font family of every text (the viewer's own sans-serif)."""
_TEXT = "#2A2A2A"


class Svg:
    """An SVG being written: elements in drawing order, then :meth:`document` around them.

    Example:
        >>> svg = Svg()
        >>> svg.text(10, 20, "a < b", size=12, anchor="middle")
        >>> svg.elements
        ['<text x="10" y="20" font-size="12" text-anchor="middle">a &lt; b</text>']
        >>> svg.document(100, 40.2, "t", defs="")[:96]
        '<svg xmlns="http://www.w3.org/2000/svg" width="100%" viewBox="0 0 100 41" style="max-width:100px'

    """

    def __init__(self) -> None:
        self.elements: list[str] = []

    def add(self, element: str) -> None:
        """Draw ``element`` (SVG text) above what is drawn so far."""
        self.elements.append(element)

    def text(
        self,
        x: float,
        y: float,
        text: str,
        *,
        size: float | None = None,
        anchor: str | None = None,
        fill: str | None = None,
        weight: str | None = None,
    ) -> None:
        """A line of text at ``(x, y)`` (its baseline); attributes left out where None (the document's defaults)."""
        attributes = "".join(
            f' {name}="{value}"'
            for name, value in (
                ("font-size", None if size is None else px(size)),
                ("text-anchor", anchor),
                ("fill", fill),
                ("font-weight", weight),
            )
            if value is not None
        )
        self.add(f'<text x="{px(x)}" y="{px(y)}"{attributes}>{escape(text)}</text>')

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str, extra: str = "") -> None:
        """A straight line; ``extra`` adds attributes (`` stroke-width="2"``)."""
        self.add(f'<line x1="{px(x1)}" y1="{px(y1)}" x2="{px(x2)}" y2="{px(y2)}" stroke="{stroke}"{extra}/>')

    def interval(self, x: float, top: float, bottom: float, cap: float, colour: str) -> None:
        """An error bar from ``top`` to ``bottom`` at ``x``, with caps ``cap`` pixels to either side."""
        self.add(
            f'<path d="M{px(x - cap)} {px(top)}h{px(2 * cap)}M{px(x)} {px(top)}V{px(bottom)}'
            f'M{px(x - cap)} {px(bottom)}h{px(2 * cap)}" stroke="{colour}" stroke-width="1.5" fill="none"/>'
        )

    def cross(self, x: float, y: float, size: float, colour: str) -> None:
        """An ``x`` centred on ``(x, y)``, ``size`` pixels from its centre to each end."""
        self.add(
            f'<path d="M{px(x - size)} {px(y - size)}L{px(x + size)} {px(y + size)}M{px(x - size)} {px(y + size)}'
            f'L{px(x + size)} {px(y - size)}" stroke="{colour}" stroke-width="2.5"/>'
        )

    def document(self, width: float, height: float, title: str, defs: str) -> str:
        """The standalone SVG: a white ``width`` x ``height`` (rounded up) ground titled ``title``, ``defs`` (patterns)
        and every element drawn, as wide as the cell or page that shows it.

        Why no size in pixels: JupyterLab (and GitHub) show an SVG output as an ``<img>``, and JupyterLab's style
        bounds its images' width but not that of an SVG's ``<img>``, which an SVG ``width="960"`` made 960 px wide in
        an 850-px cell (its right part cut off; issue 71). Without a size of its own the drawing takes the width
        it is given, its height following the ``viewBox``; drawn inline (a page, a widget) it stops at ``width``.
        """
        height = math.ceil(height)
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" viewBox="0 0 {width} {height}" '
            f'style="max-width:{width}px;height:auto" font-family="{html.escape(FONT)}" '
            f'font-size="11" fill="{_TEXT}" role="img" aria-label="{escape(title)}">'
            f"<title>{escape(title)}</title><defs>{defs}</defs>"
            f'<rect width="{width}" height="{height}" fill="#FFFFFF"/>'
        )
        return head + "\n".join(self.elements) + "\n</svg>\n"


def nice_ticks(tallest: float, count: int = 5) -> list[float]:
    """Round values from 0 to at least ``tallest``, about ``count`` steps of 1, 2, 2.5 or 5 times a power of ten.

    Example:
        >>> nice_ticks(7.3), nice_ticks(0)
        ([0, 2, 4, 6, 8], [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    """
    if not (tallest > 0 and math.isfinite(tallest)):
        tallest = 1.0
    raw = tallest / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(factor * power for factor in (1, 2, 2.5, 5, 10) if factor * power >= raw)
    steps = math.ceil(tallest / step - 1e-9)
    return [round(step * number, 10) for number in range(steps + 1)]


def axis_number(value: float) -> str:
    """A value for an axis or a tooltip: whole numbers with thousands separated, others to three digits, never in
    scientific notation (a 70B model's samples/s on a CPU is a few hundred-thousandths).

    Example:
        >>> axis_number(12000.0), axis_number(2.345), axis_number(1234.5), axis_number(0.0000123)
        ('12,000', '2.35', '1,234', '0.0000123')
    """
    if value == int(value) and abs(value) < 1e9:
        return f"{int(value):,}"
    if abs(value) < 1e-3:
        decimals = 2 - math.floor(math.log10(abs(value)))
        return f"{value:.{decimals}f}".rstrip("0")
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def wrap(text: str, first: float, rest: float, width: Callable[[str], float]) -> list[str]:
    """``text`` in lines broken between words: the first at most ``first`` pixels wide, the others ``rest``, as
    ``width`` measures a line.

    Example:
        >>> wrap("one two three", 8, 8, len)
        ['one two', 'three']
    """
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        room = first if not lines else rest
        candidate = f"{line} {word}" if line else word
        if line and width(candidate) > room:
            lines.append(line)
            line = word
        else:
            line = candidate
    lines.append(line)
    return lines


def bold_width(text: str, size: float) -> float:
    """:func:`~memlab.report.views.plan_axis.text_width` for bold text, which runs wider.

    Example:
        >>> bold_width("plain", 10)
        36.0
    """
    return 1.2 * text_width(text, size)


def escape(text: str) -> str:
    """``text`` as SVG text or an attribute's value.

    Example:
        >>> escape('"a" < b')
        '&quot;a&quot; &lt; b'
    """
    return html.escape(text, quote=True)


def px(value: float) -> str:
    """A coordinate to a tenth of a pixel, without trailing zeros (small files).

    Example:
        >>> px(12.0), px(3.14159)
        ('12', '3.1')
    """
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text
