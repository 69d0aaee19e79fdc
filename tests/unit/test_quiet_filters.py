"""memlab's quiet block and the user's warnings filters: where some warnings are errors (IPython always makes one
kind an error), a library's remark still never ends a trial, and the user's own ``ignore`` filters still decide."""

from __future__ import annotations

import warnings

import pytest

from memlab.runner.quiet import collecting, quiet

LIBRARY = {"__name__": "transformers.modeling_utils", "warnings": warnings}


def test_an_ignored_library_warning_stays_ignored_beside_an_error_filter() -> None:
    with warnings.catch_warnings(), collecting() as remarks:
        warnings.simplefilter("error", category=SyntaxWarning)  # as IPython's filter for one warning of its own
        warnings.filterwarnings("ignore", category=FutureWarning)  # the user's, as notebooks write it
        with quiet():
            exec("warnings.warn('is_gradient_checkpointing is deprecated', FutureWarning)", dict(LIBRARY))
    assert remarks.lines(everything=True) == []


def test_a_library_warning_is_a_remark_where_every_warning_is_an_error() -> None:
    with warnings.catch_warnings(), collecting() as remarks:
        warnings.simplefilter("error")
        with quiet():
            exec("warnings.warn('a library remark')", dict(LIBRARY))
        with pytest.raises(UserWarning):  # the user's own code still sees its filter
            warnings.warn("the user's own", stacklevel=1)
    assert remarks.lines(everything=True) == ["transformers: a library remark"]


def test_the_filters_are_the_users_again_after_the_block() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=FutureWarning)
        before = list(warnings.filters)
        with quiet():
            pass
        assert warnings.filters == before
