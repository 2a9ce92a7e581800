"""``python -m uform.cli``: the ``uform`` command."""

import sys

from . import main

sys.exit(main())
