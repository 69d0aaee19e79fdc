"""The core every lever builds on: :class:`~memlab.techniques.core.lever.Lever` (a lever's declaration),
:class:`~memlab.techniques.core.technique.Technique` (how it goes on a step), the export fragments
(:mod:`memlab.techniques.core.fragments`) and the registry that lists every lever's declaration
(:mod:`memlab.techniques.core.registry`)."""
