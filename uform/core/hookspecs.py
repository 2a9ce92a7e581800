"""Hook specifications of the ``uform`` plugin host.

A plugin is a module (or object) exposing functions named like these hooks and marked with
``uform.hookimpl``, registered through the ``uform`` entry-point group::

    [project.entry-points.uform]
    myaudio = "mypackage.uform_plugin"

Every hook is documented in ``docs/plugins.md``; a test fails when one is not.

The host calls hooks through pluggy's plugin manager and runs ``check_pending()`` after
each registration, so only functions marked ``@uform.hookimpl`` are called, and a marked
function whose name is no hook here fails its plugin (naming the hook).

How the hooks evolve (the rules pytest and tox keep for theirs):

- **New arguments** are added to a hook's spec; an implementation receives only the
  arguments it names, so existing plugins keep working. An implementation naming an
  argument the installed uform lacks fails its plugin at registration, naming the argument.
- **New hooks** are added here. A plugin implementing a hook that older uform releases do
  not have marks it ``@uform.hookimpl(optionalhook=True)``: older hosts then ignore it
  instead of failing the plugin.
- **Retiring** a hook or an argument takes a deprecation first: the spec carries
  ``warn_on_impl`` (or ``warn_on_impl_args``), so registering a plugin that implements it
  warns with a ``DeprecationWarning`` naming the replacement, for at least one minor
  release before it is removed.
- Hooks are never renamed and an argument never changes meaning in place; a new meaning
  gets a new name. ``SPEC_VERSION`` counts these changes (added here with each one).
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from .plugin import Backend, Modality

PROJECT = "uform"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

SPEC_VERSION = 1  # 1: uform_modalities(), uform_backends()


@hookspec
def uform_modalities() -> Iterable[Modality]:
    """Yield the modalities this plugin adds: each names its tower and its verbs.

    Called once when the host starts. Takes no arguments. A modality, tower or verb name
    claimed by two plugins is a conflict: neither claim is used, and a load that needs the
    name raises PluginConflictError naming both plugins.
    """
    return ()


@hookspec
def uform_backends() -> Iterable[Backend]:
    """Yield the backends this plugin adds: where towers run and how sessions are made.

    Called once when the host starts. Takes no arguments. A backend name claimed by two
    plugins is a conflict: neither is used, and a load of that placement raises
    PluginConflictError naming both plugins.
    """
    return ()
