import gc

import models  # noqa: F401  (sets threads and warning filters for every test)


def pytest_collection_finish(session):
    # What the session imported to collect the tests (torch, transformers, memlab, ...) lives until the end and
    # holds no garbage: freeze it out of the collector's generations, so that every full gc.collect() walks only
    # what the tests made since. memlab scans the live objects once per CPU measurement session and tests count
    # live tensors; over the whole library heap those collections were half of the integration tests' CPU time.
    # The frozen objects are no longer listed by gc.get_objects(): the only tensors among them are library
    # constants (bitsandbytes' 16-entry NF4/FP4 tables and two scalars), which CPU trials then leave out of "other".
    gc.collect()
    gc.freeze()
