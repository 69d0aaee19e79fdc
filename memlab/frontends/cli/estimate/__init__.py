"""The command line's ``memlab estimate``: the command (:mod:`.command`), its kept answers (:mod:`.kept`), what to try
next (:mod:`.next`), its progress lines (:mod:`.progress`) and its text (:mod:`.text`)."""
