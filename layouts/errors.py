"""The one exception type of the layout package.

Every rejection in ``layouts`` (a bad extent, a descriptor field out of range, a tensor map the driver
would refuse, a derivation that fails its own verification) raises ``LayoutError``. It subclasses
``ValueError`` so callers that already catch bad arguments keep working, and so code generation can
catch exactly this type and report "layout rejected" rather than a crash.
"""


class LayoutError(ValueError):
    """A layout, descriptor or tensor map that is invalid or fails verification."""
