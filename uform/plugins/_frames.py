"""The former name of :mod:`uform.plugins.frames`, one module with it (monkeypatching either
patches both); importers move to the public name."""

import sys

from . import frames as _public
from .frames import *  # noqa: F403 - what type checkers see

sys.modules[__name__] = _public
