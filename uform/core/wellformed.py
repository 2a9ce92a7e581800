"""What a plugin hands uform, checked: the object an entry point names, its hook functions and
the records its hooks yield.

Each check answers by raising :class:`Refused`, whose message is the whole reason the plugin is
unusable (the host records it and warns; the other plugins keep working): an entry point's value
that is not ``module`` or ``module:object`` (:data:`ENTRY_POINT`), an object that names no plugin
(a module registered already, a class, a hook function itself, an object with no hook), a hook
function left unmarked, one naming an argument its spec lacks or a hook uform does not have
(:func:`check_unregistered`, :func:`check_registered`), and a record whose fields are not what
docs/plugins.md says they are, or a name it yields twice (:func:`check_records`).
:func:`wrong_specs` checks a tower's ``tensors`` answer the same way, :func:`wrong_described` a
modality's ``describe`` answer; :func:`held` is what the host keeps of a checked record.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pluggy

from . import hookspecs
from .plugin import MODEL_NAMES, Backend, Modality, TensorSpec, Tower


class Refused(Exception):
    """A plugin refused at registration; the message is the whole reason."""


ENTRY_POINT = re.compile(r"\s*[\w.]+\s*(:\s*[\w.]+\s*)?(\[.*\]\s*)?")  # module, or module:object, [extras]


def claims(m: Modality) -> Iterator[tuple[str, str]]:
    """The names (``(kind, name)``) a modality claims: itself, its tower and its verbs."""
    yield "modality", m.name
    yield "tower", m.tower.name
    for verb in m.verbs:
        yield "verb", verb


def is_name(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_verb(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and not value.startswith("_") and value not in MODEL_NAMES


def shown(value: Any) -> str:
    """``value`` as a message shows it: its repr when it is short and plain, else its type's name."""
    return repr(value) if value is None or isinstance(value, (str, int, float)) else type(value).__name__


_Check = tuple[str, Any, Callable[[Any], bool], str]  # field, its value, whether it is right, what it should be


def wrong_fields(record: Modality | Backend) -> list[str]:
    """The fields of ``record`` that are not what docs/plugins.md says they are ([] when none)."""
    checks: list[_Check] = []
    if isinstance(record, Modality):
        tower, verbs = record.tower, record.verbs
        checks += [("name", record.name, is_name, "a non-empty str"), ("tower", tower, lambda v: isinstance(v, Tower), "a Tower")]
        if isinstance(tower, Tower):
            checks += [
                ("tower.name", tower.name, is_name, "a non-empty str"),
                ("tower.presets", tower.presets, lambda v: isinstance(v, Mapping), "a mapping"),
            ]  # fmt: skip
            checks += [(f"tower.{f}", getattr(tower, f), callable, "callable") for f in ("read", "tensors", "graph")]
        checks.append(("verbs", verbs, lambda v: isinstance(v, Mapping), "a mapping of verb name to function"))
        if isinstance(verbs, Mapping):
            for verb, fn in verbs.items():
                checks += [
                    ("a verb's name", verb, _is_verb, "an identifier that does not start with '_' and is not a name of Model's own (describe, close, ...)"),
                    (f"verbs[{verb!r}]", fn, callable, "callable"),
                ]  # fmt: skip
        checks.append(("describe", record.describe, lambda v: v is None or callable(v), "None or callable"))
    else:
        checks += [
            ("name", record.name, is_name, "a non-empty str"),
            ("placement", record.placement, lambda v: v in ("ram", "vram"), "'ram' or 'vram'"),
        ]  # fmt: skip
        checks += [(f, getattr(record, f), callable, "callable") for f in ("probe", "open", "accepts")]
        checks += [
            ("priority", record.priority, lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
            ("detail", record.detail, lambda v: v is None or callable(v), "None or callable"),
        ]  # fmt: skip
    return [f"{field} is {shown(value)}, not {expected}" for field, value, right, expected in checks if not right(value)]


def check_records(hook: str, records: list[Any], kind: type[Modality] | type[Backend]) -> None:
    """Refused naming the first record of ``hook`` that is not a well-formed ``kind``, or a
    name (modality, tower, verb, backend) it yields twice."""
    for r in records:
        if not isinstance(r, kind):
            raise Refused(f"{hook} yielded {type(r).__name__}, not {kind.__name__}")
        wrong = wrong_fields(r)
        if wrong:
            raise Refused(f"{hook} yielded the {kind.__name__} {shown(r.name)} whose {'; '.join(wrong)}")
    names = [k for r in records for k in (claims(r) if isinstance(r, Modality) else [("backend", r.name)])]
    twice = list(dict.fromkeys(k for k in names if names.count(k) > 1))
    if twice:
        what = ", ".join(f"the {kind} {name!r}" for kind, name in twice)
        raise Refused(f"{hook} yielded {what} twice; each name is one record")


def held(m: Modality) -> Modality:
    """A checked modality as the host holds it: its ``verbs`` and its tower's ``presets`` copied
    into read-only mappings, so that a plugin changing the dict it yielded later (adding a verb
    named ``describe``, or one another plugin serves) changes nothing uform uses."""
    tower = replace(m.tower, presets=MappingProxyType(dict(m.tower.presets)))
    return replace(m, tower=tower, verbs=MappingProxyType(dict(m.verbs)))


def wrong_specs(specs: Any) -> str:
    """What is wrong with a tower's ``tensors`` answer ('' when it is a mapping of name to TensorSpec)."""
    if not isinstance(specs, Mapping):
        return f"{shown(specs)}, not a mapping of tensor name to TensorSpec"
    for name, spec in specs.items():
        if not is_name(name):
            return f"the tensor name {shown(name)}, not a non-empty str"
        if not isinstance(spec, TensorSpec):
            return f"{shown(spec)} for {name!r}, not a TensorSpec"
        shape = spec.shape
        if not isinstance(shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            return f"the shape {shown(shape)} for {name!r}, not a tuple of ints (0 or more)"
    return ""


DESCRIBED = ("token_width", "choice_temperature_groups")  # the ModelDescription fields a modality gives


def wrong_described(answer: Any) -> str:
    """What is wrong with a modality's ``describe`` answer ('' when it is a mapping of fields of
    :data:`DESCRIBED` to ints, 0 or more)."""
    if not isinstance(answer, Mapping):
        return f"{shown(answer)}, not a mapping of description field to int"
    for name, value in answer.items():
        if name not in DESCRIBED:
            return f"the field {shown(name)}, not one of {', '.join(DESCRIBED)}"
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"{shown(value)} for {name!r}, not an int (0 or more)"
    return ""


# -- registration --------------------------------------------------------------------------


def check_unregistered(manager: pluggy.PluginManager, plugin: Any) -> None:
    """Refused when ``plugin`` (not registered yet) names no plugin: a module registered already,
    a class, a hook function itself; or when a hook function of it is unmarked or names an
    argument its spec lacks."""
    other = manager.get_name(plugin)
    if other is not None:
        raise Refused(
            f"its module {getattr(plugin, '__name__', plugin)!r} is registered already, as plugin {other!r}; "
            "a module is one plugin: declare one entry point for it"
        )
    if inspect.isclass(plugin):
        raise Refused(
            f"the entry point names the class {plugin.__name__}, whose hooks would be called without an "
            "instance: name a module, or an instance of it (plugin = " + plugin.__name__ + "())"
        )
    if callable(plugin) and hasattr(plugin, f"{hookspecs.PROJECT}_impl"):
        raise Refused(
            f"the entry point names the hook function {getattr(plugin, '__name__', '?')} itself: "
            "name the module (or object) that holds it"
        )
    unmarked = _unmarked_hooks(manager, plugin)
    if unmarked:
        raise Refused(
            f"{', '.join(unmarked)} {'is' if len(unmarked) == 1 else 'are'} not marked with @uform.hookimpl, "
            "so uform never calls it; mark it"
        )
    extra = _unknown_arguments(manager, plugin)
    if extra:
        raise Refused(extra)


def check_registered(manager: pluggy.PluginManager, plugin: Any) -> None:
    """Refused when the registered ``plugin`` implements a hook uform does not have, or none at all."""
    try:
        manager.check_pending()
    except pluggy.PluginValidationError:
        raise Refused(_unknown_hooks(manager, plugin)) from None
    if not manager.get_hookcallers(plugin):
        raise Refused(
            f"{getattr(plugin, '__name__', type(plugin).__name__)!r} has no function marked @uform.hookimpl "
            f"(uform's hooks are {', '.join(_specs(manager))}): the entry point names something that is not a uform plugin"
        )


def _specs(manager: pluggy.PluginManager) -> list[str]:
    return sorted(n for n, c in vars(manager.hook).items() if not n.startswith("_") and c.has_spec())


def _unmarked_hooks(manager: pluggy.PluginManager, plugin: Any) -> list[str]:
    specs = _specs(manager)
    return sorted(
        n for n in specs
        if callable(getattr(plugin, n, None)) and not hasattr(getattr(plugin, n), f"{hookspecs.PROJECT}_impl")
    )  # fmt: skip


def _unknown_arguments(manager: pluggy.PluginManager, plugin: Any) -> str:
    """Why a marked hook names arguments its spec lacks ('' when none does)."""
    for hook in _specs(manager):
        impl = getattr(plugin, hook, None)
        if impl is None or not hasattr(impl, f"{hookspecs.PROJECT}_impl"):
            continue
        spec = inspect.signature(getattr(hookspecs, hook)).parameters
        extra = [p for p in inspect.signature(impl).parameters if p not in spec]
        if extra:
            have = ", ".join(spec) or "no arguments"
            return (
                f"{hook} names {', '.join(map(repr, extra))}, which the hook does not pass in this uform "
                f"(hookspec version {hookspecs.SPEC_VERSION}: {hook} takes {have}); upgrade uform or drop the argument"
            )
    return ""


def _unknown_hooks(manager: pluggy.PluginManager, plugin: Any) -> str:
    specs = _specs(manager)
    unknown = []
    for caller in manager.get_hookcallers(plugin) or []:
        if not caller.has_spec() and any(not i.optionalhook for i in caller.get_hookimpls() if i.plugin is plugin):
            close = difflib.get_close_matches(caller.name, specs, 1)
            unknown.append(f"{caller.name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (
        f"unknown hook {', '.join(unknown)}: uform's hooks are {', '.join(specs)}; "
        "a hook of a newer uform is marked @uform.hookimpl(optionalhook=True)"
    )
