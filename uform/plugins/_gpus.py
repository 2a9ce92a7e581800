"""The former name of :mod:`uform.plugins.gpus`, one module with it (monkeypatching either
patches both); importers move to the public name."""

import sys

from . import gpus as _public
from .gpus import *  # noqa: F403 - what type checkers see

sys.modules[__name__] = _public
