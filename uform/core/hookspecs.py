"""Hook specifications of the ``uform`` plugin host.

A plugin is a module (or object) exposing functions named like these hooks and marked with
``uform.hookimpl``, registered through the ``uform`` entry-point group::

    [project.entry-points.uform]
    myaudio = "mypackage.uform_plugin"

Every hook is documented in ``docs/plugins.md``; a test fails when one is not.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from .plugin import Backend, Modality

PROJECT = "uform"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def uform_modalities() -> Iterable[Modality]:
    """Yield the modalities this plugin adds: each names its tower and its verbs.

    Called once when the host starts. Takes no arguments. A modality or tower name claimed
    by two plugins is an error naming both distributions.
    """
    return ()


@hookspec
def uform_backends() -> Iterable[Backend]:
    """Yield the backends this plugin adds: where towers run and how sessions are made.

    Called once when the host starts. Takes no arguments. A backend name claimed by two
    plugins is an error naming both distributions.
    """
    return ()
