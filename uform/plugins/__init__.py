"""uform's built-in plugins, each registered through the ``uform`` entry-point group."""
