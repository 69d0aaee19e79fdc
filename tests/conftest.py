import models  # noqa: F401  (sets threads and warning filters for every test)
