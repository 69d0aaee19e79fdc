"""The levers' declarations by what they change: the batch (:mod:`.batch`), the model (:mod:`.model`) and the step
(:mod:`.step`)."""
