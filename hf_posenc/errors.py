"""The one exception type users see for their own mistakes."""


class PosEncError(ValueError):
    """A user mistake: unknown scheme or architecture, bad option, input past a limit.

    The message always names what was wrong and what is allowed instead.
    """
