"""The ``memlab`` command line: the command itself (:mod:`.main`: ``memlab demo``, ``memlab estimate``), its argument
errors (:mod:`.errors`), ``memlab estimate`` (:mod:`.estimate`) and its groups of options, each a module: the GPU
(:mod:`.gpu`), the load (:mod:`.load`), the host budget (:mod:`.host`), the sizes that fit (:mod:`.limits`), the
allocator's expandable segments (:mod:`.allocator`), a trainer's step (:mod:`.trainer`, what a trainer kind adds to it
asked of the kind, and :mod:`.trainer_floor`); what the process never imports (:mod:`.unused_imports`)."""
