"""``fit`` in steps, each a function of what the step before gave: the request (:mod:`.request`: what ``fit`` was
asked, checked), the space (:mod:`.space`: the budget, the levers searched, the candidate plans), the dry runs
(:mod:`.dry_runs`: the estimates that prune a measured search, or a search made of them alone), the measurement
(:mod:`.measured`: the plans run on the live model) and the choice (:mod:`.choice`: the report, and where nothing fits
what would). :func:`memlab.search.fit.fit` builds the request and runs the steps."""
