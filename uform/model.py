"""``Model``: a loaded checkpoint serving every modality it was trained on.

Loading, receivers, what a load serves, zero-shot labels and closing are here; the modality
verbs typed as the API page states them are ``TypedVerbs`` (``uform/typed_verbs.py``), which
``Model`` inherits; each forwards to whichever installed plugin provides it (the core knows no
modality by name).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .core.arena import Arena
from .core.checkpoint import CheckpointFile
from .core.executor import DeferredOn, Executor, On, check_executor
from .core.progress import ProgressHandler
from .core.runtime import Runtime, as_buffer
from .core.types import CPUClass, GPUClass, ModelDescription, Scalar, pin
from .lifecycle import Life
from .typed_verbs import Files, TypedVerbs
from .verbs import Served, served_by, utf8_of

if TYPE_CHECKING:
    from typing_extensions import Buffer

_PathLike = str | os.PathLike[str]
DEFAULT_CHECKPOINT = Path(__file__).parent / "data" / "default.safetensors"


def default_checkpoint() -> Path:
    """The path of the small trained checkpoint that ships inside the package: what
    ``Model.load_ram()`` and ``Model.load_vram()`` load when given no path, and what every
    ``uform`` command uses when given no ``--model``.

    Raises ``FileNotFoundError`` naming the path when the file is missing from this install.
    """
    if not DEFAULT_CHECKPOINT.is_file():
        raise FileNotFoundError(
            f"the default checkpoint {DEFAULT_CHECKPOINT} is missing from this install of uform "
            "(it ships inside the package as uform/data/default.safetensors); reinstall uform, or give a checkpoint's path"
        )
    return DEFAULT_CHECKPOINT


class Model(TypedVerbs):
    """A loaded encoder serving every modality it was trained on; load it with a ``load_*`` classmethod.

    ``close()`` (or leaving a ``with Model.load_ram(...) as model:`` block) releases it.
    """

    def __init__(self, runtime: Runtime, executor: Executor | None = None, *, owns_executor: bool = False, _life: Life | None = None) -> None:
        if not isinstance(runtime, Runtime):  # Model(path) built a model that failed later, in describe() or a verb
            raise TypeError(
                f"Model() takes a loaded runtime, not {type(runtime).__name__}: load a checkpoint with "
                "Model.load_ram(path), Model.load_ram_buffer(buffer), Model.load_vram(path) or Model.load_vram_buffer(buffer)")
        self._runtime = runtime
        self._executor = executor
        self._life = _life or Life(owns_executor, held=runtime)

    # -- loading -------------------------------------------------------------------------

    @classmethod
    def load_ram(
        cls,
        path: _PathLike | None = None,
        /,
        *,
        memory_domains: Sequence[int] | None = None,
        cpu_class: CPUClass | None = None,
        executor: Executor | None = None,
        quantization: Scalar = Scalar.BF16,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
    ) -> Model:
        """Copies a checkpoint file into host memory; with no ``path``, the default checkpoint
        (:func:`default_checkpoint`)."""
        return _from_file(
            cls, path, "ram", executor, quantization=quantization, progress=progress, progress_steps=progress_steps,
            cpu_class=_pinned(cpu_class, CPUClass), memory_domains=memory_domains,
        )  # fmt: skip

    @classmethod
    def load_ram_buffer(
        cls,
        buffer: Buffer,
        /,
        *,
        memory_domains: Sequence[int] | None = None,
        cpu_class: CPUClass | None = None,
        executor: Executor | None = None,
        quantization: Scalar = Scalar.BF16,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
    ) -> Model:
        """Copies a checkpoint held in memory (bytes, bytearray, memoryview, mmap) into host memory."""
        return cls(_runtime(
            buffer, placement="ram", executor=executor, quantization=quantization, progress=progress,
            progress_steps=progress_steps, cpu_class=_pinned(cpu_class, CPUClass), memory_domains=memory_domains,
        ), owns_executor=executor is None)  # fmt: skip

    @classmethod
    def load_vram(
        cls,
        path: _PathLike | None = None,
        /,
        *,
        devices: Sequence[int] | None = None,
        gpu_class: GPUClass | None = None,
        executor: Executor | None = None,
        quantization: Scalar = Scalar.BF16,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
    ) -> Model:
        """Copies a checkpoint file onto the named GPUs; with no ``path``, the default checkpoint
        (:func:`default_checkpoint`)."""
        return _from_file(
            cls, path, "vram", executor, quantization=quantization, progress=progress, progress_steps=progress_steps,
            gpu_class=_pinned(gpu_class, GPUClass), devices=devices,
        )  # fmt: skip

    @classmethod
    def load_vram_buffer(
        cls,
        buffer: Buffer,
        /,
        *,
        devices: Sequence[int] | None = None,
        gpu_class: GPUClass | None = None,
        executor: Executor | None = None,
        quantization: Scalar = Scalar.BF16,
        progress: ProgressHandler | None = None,
        progress_steps: int = 0,
    ) -> Model:
        """Copies a checkpoint held in host memory onto the named GPUs."""
        return cls(_runtime(
            buffer, placement="vram", executor=executor, quantization=quantization, progress=progress,
            progress_steps=progress_steps, gpu_class=_pinned(gpu_class, GPUClass), devices=devices,
        ), owns_executor=executor is None)  # fmt: skip

    # -- receivers -----------------------------------------------------------------------

    def on(self, executor: Executor, /) -> On[Model]:
        """A receiver whose verbs run with ``executor`` and block until done."""
        return On(Model(self._runtime, _check_executor(executor), _life=self._life)._verb_named)

    def deferred(self, executor: Executor, /) -> DeferredOn[Model]:
        """A receiver whose verbs are submitted to ``executor`` and answer a :class:`Deferred`."""
        return DeferredOn(Model(self._runtime, _check_executor(executor), _life=self._life)._verb_named, executor)

    def _verb_named(self, name: str) -> Callable[..., Any]:
        """This model's verb ``name`` (what the receivers of ``on`` and ``deferred`` call)."""
        if name.startswith("_") or name in _NOT_VERBS:
            raise AttributeError(f"{name!r} is not a Model verb")
        return getattr(self, name)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """Verbs of third-party modalities: ``model.smell_encode(...)`` when a plugin serves it."""
        if not name.startswith("_") and name in self.served.verbs:
            return functools.partial(self._verb, name)
        raise AttributeError(f"{name!r} is not a Model verb of this checkpoint's modalities")

    # -- verbs ---------------------------------------------------------------------------

    def describe(self) -> ModelDescription:
        """The model's geometry and placement."""
        return self._runtime.describe()

    @property
    def source(self) -> dict[str, str] | None:
        """Where a converted model came from: checkpoint format version 2's ``source``
        (``family``, ``name``, ``architecture``, ``converter``), or None for uform's own."""
        found = self._runtime.config.source
        return None if found is None else {str(k): str(v) for k, v in found.items()}

    @property
    def labels(self) -> dict[str, Any] | None:
        """How the model turns cosines into zero-shot label probabilities (format version 2's
        ``labels``: ``kind`` ``"softmax"`` or ``"sigmoid"``, ``scale``, ``bias``), or None."""
        found = self._runtime.config.raw.get("labels")
        return None if found is None else {"kind": found["kind"], "scale": float(found["scale"]), "bias": float(found.get("bias", 0.0))}

    def label_probabilities(self, embeddings: Any, labels: Sequence[str], /) -> np.ndarray:
        """Zero-shot probabilities ``[N, L]`` (float32) of items against label texts, as the
        model was trained to give them: CLIP's softmax over ``scale`` x cosine across the labels
        (each row sums to 1), SigLIP's ``sigmoid(scale x cosine + bias)`` for each label.
        ``embeddings``: unit rows ``[N, D]`` (or one ``[D]``) from any encode verb in F32.
        Raises ``UnsupportedError`` for a model without ``labels`` (uform's own)."""
        from .core import labels as zero_shot

        spec = zero_shot.spec(self.labels)
        items = zero_shot.rows(embeddings, self.describe().dimensions)
        texts = zero_shot.label_texts(labels, utf8_of)
        encoded = self.text_encode(texts, Arena()).embeddings
        return zero_shot.probabilities(spec, items, np.array(encoded))

    def image_labels(self, files: Files, labels: Sequence[str], /) -> np.ndarray:
        """:meth:`label_probabilities` of pictures (paths, bytes or binary file objects, as
        :meth:`image_encode` takes them): ``[len(files), len(labels)]`` float32."""
        from .core import labels as zero_shot

        zero_shot.spec(self.labels)
        texts = zero_shot.label_texts(labels, utf8_of)
        images = np.array(self.image_encode(files, Arena()).embeddings)
        return self.label_probabilities(images, texts)

    @property
    def served(self) -> Served:
        """What this load serves: towers, modalities, verbs and choice temperatures."""
        return served_by(self._runtime)

    @property
    def backend(self) -> str:
        """The backend plugin that placed the model (``"e4m3"``, ``"cpu"``, ``"cuda"``, ...)."""
        return self._runtime.placement.backend

    @property
    def compute(self) -> str:
        """What the transformer's products run in, in words: ``describe().quantization`` is
        what the weights are held in (``"bf16 products, float32 sums (avx512-bf16 kernels)"``)."""
        return self._runtime.placement.compute

    def _verb(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._life.enter()
        try:
            return self._runtime.call(name, self._executor, args, kwargs)
        finally:
            self._life.leave()

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse further calls (``ValueError``), wait for the calls running, close the
        placement's runners (replica threads; sessions go with the last reference) and join the
        threads of the executor the load made. An executor passed to the load is the caller's
        to close. Closing again does nothing; receivers made by ``on``/``deferred`` close too.
        Called inside one of this model's calls (its progress handler), it raises ``RuntimeError``
        and leaves the model open: it would wait for itself."""
        if not self._life.close():
            return
        runners = self._runtime.placement.runners
        if not self._life.forked:  # a child of os.fork keeps the sessions it inherited: freeing them
            for runner in runners.values():  # hung, ONNX Runtime's threads being the parent's
                close = getattr(runner, "close", None)
                if callable(close):
                    close()
            if isinstance(runners, dict):
                runners.clear()
        if self._life.owns_executor:  # in a forked child: the threads it started itself
            self._runtime.executor.close()

    def __reduce__(self) -> Any:
        """A model is its process's sessions and threads: pickling one (a ``spawn`` pool's
        arguments, ``deepcopy``) is refused in uform's words, not ONNX Runtime's."""
        raise TypeError(
            "a uform.Model cannot be pickled or copied to another process (its ONNX Runtime sessions and threads "
            "are this process's): pass the checkpoint's path and load it there with Model.load_ram(path), "
            "or use a multiprocessing 'fork' pool, whose workers inherit it (docs/api.md, os.fork)")

    def __copy__(self) -> Model:
        return Model(self._runtime, self._executor, _life=self._life)

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        d = self.describe()
        closed = ", closed" if self._life.closed else ""
        return f"Model(towers={list(self.served.towers)}, dimensions={d.dimensions}, quantization={d.quantization.name}{closed})"


def _from_file(cls: type[Model], path: _PathLike | None, placement: str, executor: Executor | None, **options: Any) -> Model:
    """A model loaded from ``path`` (None: the default checkpoint), read by ``CheckpointFile``
    (header, then each tensor when a backend asks; no map); nothing refers to it afterwards."""
    if path is not None and not os.fspath(path):  # pathlib reads '' as '.', the current folder
        raise FileNotFoundError("the checkpoint path is empty: name a .safetensors file, or pass None for the default model")
    with CheckpointFile(default_checkpoint() if path is None else path) as source:
        runtime = Runtime.load(source, placement=placement, executor=executor, **options)
    return cls(runtime, owns_executor=executor is None)


def runtime_of(model: Model) -> Runtime:
    """The host's record of ``model``'s load (``uform.core.runtime.Runtime``: config, towers,
    placement and its runners): for tests, benchmarks and tools that look beneath the API
    page, which this is no part of; what a load serves is :attr:`Model.served`."""
    return model._runtime


def _runtime(buffer: Buffer, **options: Any) -> Runtime:
    """The runtime loaded from a checkpoint's bytes; the caller's buffer is not held after."""
    if isinstance(buffer, memoryview):
        try:
            buffer.nbytes
        except ValueError:
            raise ValueError("the checkpoint buffer is a released memoryview (memoryview.release() or the end of its with block): "
                             "nothing can be read from it") from None
    view = as_buffer(buffer)
    try:
        return Runtime.load(view, **options)
    finally:
        view.release()


def _pinned(value: Any, kind: type[Any]) -> Any:
    """A load's ``cpu_class`` or ``gpu_class`` checked before any backend sees it: a value that is no
    class is the caller's error (ValueError), not one more backend refusing the load."""
    return None if value is None else pin(value, kind, "cpu_class" if kind is CPUClass else "gpu_class")


_NOT_VERBS = {"load_ram", "load_ram_buffer", "load_vram", "load_vram_buffer", "on", "deferred", "close"}


def _check_executor(executor: Any) -> Executor:
    check_executor(executor)
    return executor  # type: ignore[no-any-return]

