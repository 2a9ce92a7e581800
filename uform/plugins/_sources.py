"""The former name of :mod:`uform.plugins.sources`, one module with it (monkeypatching either
patches both); importers move to the public name."""

import sys

from . import sources as _public
from .sources import *  # noqa: F403 - what type checkers see

sys.modules[__name__] = _public
