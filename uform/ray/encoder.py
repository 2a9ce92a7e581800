"""Ray Data's callable class: one :class:`~uform.Model` per actor, loaded once, that encodes each
batch of a dataset column; a refused item becomes its row's error, never the batch's
(docs/scale.md). :func:`uform.ray.encode_dataset` maps a dataset through it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import ray  # uform/ray/__init__.py imported it first, or said what installs it

from ..core.arena import Arena, Encoded
from ..core.errors import InputError
from ..core.executor import MAX_THREADS, Executor, available_cores
from ..core.scalars import coerce, layout, store
from ..core.types import Outputs, Scalar
from ..model import Model
from ..verbs import ENCODE_VERBS

__all__ = ["MODALITIES", "CheckpointSource", "Encoder", "refuse_modality"]

MODALITIES: Mapping[str, str] = ENCODE_VERBS  # what an Encoder's `modality` names -> the Model verb serving it

# scalars numpy has no dtype of its own for: handed to Ray (Arrow) as their bit patterns
_BITS: dict[Scalar, type[np.unsignedinteger[Any]]] = {Scalar.BF16: np.uint16, Scalar.E4M3: np.uint8, Scalar.E5M2: np.uint8}
# after this many refused items in one batch, the rest of the batch is encoded row by row
_RETRIES = 4

CheckpointSource = str | os.PathLike[str] | bytes | bytearray | memoryview | ray.ObjectRef  # type: ignore[type-arg]


def refuse_modality(modality: str) -> None:
    """A modality no verb serves, refused by name (an Encoder's and encode_dataset's)."""
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {', '.join(MODALITIES)}; got {modality!r}")


def positive(value: object) -> bool:
    """Whether ``value`` is an int (not a bool) above 0."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class Encoder:
    """A Ray Data callable class: ``ds.map_batches(Encoder, fn_constructor_kwargs={...},
    compute=ray.data.ActorPoolStrategy(size=n), num_cpus=threads)``.

    Each actor loads the checkpoint once, in ``__init__`` (``Model.load_ram``, or
    ``load_vram`` on the GPUs Ray gave the actor), with an :class:`~uform.Executor` of the
    CPUs Ray gave it, and encodes every batch given to it with one :class:`~uform.Arena`
    whose results are copied into arrays of their own before Ray sees them. Arguments: see
    docs/scale.md. Instances pickle as their arguments (the model is loaded again where
    they are unpickled).
    """

    def __init__(
        self,
        checkpoint: CheckpointSource,
        modality: str,
        column: str,
        *,
        outputs: Outputs = Outputs.EMBEDDINGS,
        outputs_scalar: Scalar | str = Scalar.F32,
        dimensions: int | None = None,
        sample_rate: int | None = None,
        quantization: Scalar | str = Scalar.BF16,
        placement: str = "auto",
        threads: int | None = None,
        output_column: str = "embedding",
        tokens_column: str = "tokens",
        error_column: str = "error",
    ) -> None:
        refuse_modality(modality)
        if modality == "audio_samples" and not positive(sample_rate):
            raise ValueError(f"modality 'audio_samples' needs sample_rate, a positive int; got {sample_rate!r}")
        if dimensions is not None and not positive(dimensions):
            raise ValueError(f"dimensions must be a positive int (a Matryoshka prefix) or None; got {dimensions!r}")
        if placement not in ("auto", "ram", "vram"):
            raise ValueError(f"placement must be 'auto', 'ram' or 'vram'; got {placement!r}")
        if threads is not None and not (positive(threads) and threads <= MAX_THREADS):
            raise ValueError(f"threads must be an int from 1 to {MAX_THREADS} or None; got {threads!r}")
        self._args: dict[str, Any] = dict(
            checkpoint=checkpoint, modality=modality, column=column, outputs=outputs, outputs_scalar=outputs_scalar,
            dimensions=dimensions, sample_rate=sample_rate, quantization=quantization, placement=placement,
            threads=threads, output_column=output_column, tokens_column=tokens_column, error_column=error_column,
        )  # fmt: skip
        self.modality = modality
        self.column = column
        self.outputs = Outputs(outputs)
        self.outputs_scalar = coerce(outputs_scalar)
        self.dimensions = dimensions
        self.sample_rate = sample_rate
        self.quantization = coerce(quantization, "quantization")
        self.placement = placement
        self.output_column = output_column
        self.tokens_column = tokens_column
        self.error_column = error_column
        self._checkpoint = checkpoint
        self.threads = threads or _assigned("CPU") or available_cores()
        self.gpus = _gpu_count() if placement != "ram" else 0
        if placement == "vram" and not self.gpus:
            raise ValueError("placement='vram' needs an actor with GPUs (num_gpus=... in map_batches); Ray gave this one none")
        self.executor = Executor(self.threads)
        self.model = self.load_model()
        self.loads = 1  # models this instance loaded: one, whatever the number of batches
        self.batches = 0
        width = self.model.describe().dimensions
        if dimensions is not None and dimensions > width:
            raise ValueError(f"dimensions={dimensions} exceeds the checkpoint's {width}")
        self.width = dimensions or width
        self._verb: Callable[..., Encoded] = getattr(self.model, MODALITIES[modality])
        self._arena = Arena()
        self._lock = threading.Lock()  # one batch at a time writes into the arena

    def load_model(self) -> Model:
        """Loads the checkpoint; called once, by ``__init__`` (a subclass may override it)."""
        source = self._checkpoint
        if isinstance(source, ray.ObjectRef):
            source = ray.get(source)
        vram = self.gpus > 0
        if isinstance(source, (str, os.PathLike)):
            if vram:
                return Model.load_vram(source, devices=list(range(self.gpus)), executor=self.executor, quantization=self.quantization)
            return Model.load_ram(source, executor=self.executor, quantization=self.quantization)
        if vram:
            return Model.load_vram_buffer(source, devices=list(range(self.gpus)), executor=self.executor, quantization=self.quantization)
        return Model.load_ram_buffer(source, executor=self.executor, quantization=self.quantization)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._args))

    def close(self) -> None:
        """Releases the model and the executor's threads."""
        self.model.close()
        self.executor.close()

    # -- one batch -----------------------------------------------------------------------

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Adds the output columns to ``batch`` (a numpy batch); every other column is kept."""
        items = _items(batch[self.column], self.modality)
        with self._lock:
            embeddings, tokens, errors = self._encode(items)
            self.batches += 1
        out = dict(batch)
        n = len(items)
        shape, dtype, scaled = layout(self.outputs_scalar, n, self.width)
        stored = np.empty(shape, dtype)
        scales = np.empty(n, np.float32) if scaled else None
        with np.errstate(invalid="ignore"):  # refused rows are NaN: NaN codes, or I8 rows of 0 with a NaN scale
            store(embeddings, self.outputs_scalar, stored, scales)
        if scaled:
            assert scales is not None
            refused = np.array([bool(e) for e in errors], bool)
            stored[refused], scales[refused] = 0, np.nan
            out[self.output_column + "_scale"] = scales
        out[self.output_column] = _plain(stored, self.outputs_scalar)
        if tokens is not None:
            rows = np.empty(n, object)
            row_scales = np.empty(n, object)
            for i, t in enumerate(tokens):
                shape, dtype, _ = layout(self.outputs_scalar, len(t), t.shape[1])
                rows[i] = np.empty(shape, dtype)
                row_scales[i] = np.empty(len(t), np.float32)
                store(t, self.outputs_scalar, rows[i], row_scales[i])
                rows[i] = _plain(rows[i], self.outputs_scalar)
            out[self.tokens_column] = rows
            if scaled:
                out[self.tokens_column + "_scale"] = row_scales
        out[self.error_column] = np.array(errors, dtype=object)
        return out

    def _encode(self, items: list[Any]) -> tuple[np.ndarray, list[np.ndarray] | None, list[str]]:
        """float32 embeddings [n, width] (NaN rows where refused), token rows (float32, empty
        where refused) when asked, and each row's error ("" when encoded). Always fresh
        arrays: nothing returned is a view into the arena the next batch reuses."""
        n = len(items)
        errors = [""] * n
        embeddings = np.full((n, self.width), np.nan, np.float32)
        want_tokens = bool(self.outputs & Outputs.TOKENS)
        token_width = self.model.describe().token_width
        tokens: list[np.ndarray] | None = [np.zeros((0, token_width), np.float32)] * n if want_tokens else None
        pending = list(range(n))
        refused = 0
        while pending and refused < _RETRIES:
            try:
                self._write(pending, self._call([items[i] for i in pending]), embeddings, tokens)
                return embeddings, tokens, errors
            except InputError as e:  # one item refused: note it, encode the others again
                if not 0 <= e.index < len(pending):
                    raise
                errors[pending.pop(e.index)] = f"{type(e).__name__}: {e.reason}"
                refused += 1
            except Exception:  # not one item's fault as far as we know: find out row by row
                break
        failures: list[Exception] = []
        for i in pending:  # many refusals, or an error naming no item: each row alone
            try:
                self._write([i], self._call([items[i]]), embeddings, tokens)
            except Exception as e:
                errors[i] = f"{type(e).__name__}: {e.reason if isinstance(e, InputError) else e}"
                failures.append(e)
        if len(pending) > 1 and len(failures) == len(pending) and not any(isinstance(e, InputError) for e in failures):
            raise failures[0]  # no row encodes, alone, for a reason none of them is named in: the model's, not theirs
        return embeddings, tokens, errors

    def _call(self, items: list[Any]) -> Encoded:
        outputs = self.outputs | Outputs.EMBEDDINGS
        if self.modality == "audio_samples":
            return self._verb(items, self.sample_rate, self._arena, outputs=outputs, outputs_scalar=Scalar.F32)
        return self._verb(items, self._arena, outputs=outputs, outputs_scalar=Scalar.F32)

    def _write(self, rows: list[int], encoded: Encoded, embeddings: np.ndarray, tokens: list[np.ndarray] | None) -> None:
        e = encoded.embeddings  # a view into the arena: copied below, by fancy-index assignment
        if self.dimensions is not None:
            e = e[:, : self.dimensions]
            e = e / np.linalg.norm(e, axis=1, keepdims=True)
        embeddings[rows] = e
        if tokens is not None:
            tape = encoded.tokens
            assert tape is not None
            for j, i in enumerate(rows):
                tokens[i] = np.array(tape[j], np.float32, copy=True)


def _rebuild(cls: type[Encoder], args: dict[str, Any]) -> Encoder:
    args = dict(args)
    return cls(args.pop("checkpoint"), args.pop("modality"), args.pop("column"), **args)


def _plain(a: np.ndarray, scalar: Scalar) -> np.ndarray:
    """``a`` as a dtype Arrow holds: ml_dtypes scalars as their bits (``.view(ml_dtypes.bfloat16)`` reads them)."""
    bits = _BITS.get(scalar)
    return a.view(bits) if bits is not None else a


def _items(column: np.ndarray, modality: str) -> list[Any]:
    """A numpy batch column as the items a verb takes."""
    if modality in ("image_pixels", "audio_samples"):
        return list(column)  # rows of a tensor column, or the arrays of a ragged one
    return [x.item() if isinstance(x, np.generic) else x for x in column]


def _assigned(resource: str) -> int:
    """Whole units of ``resource`` Ray assigned to this worker (0 outside Ray)."""
    if not ray.is_initialized():
        return 0
    amount = ray.get_runtime_context().get_assigned_resources().get(resource, 0.0)  # type: ignore[no-untyped-call]
    return max(1, int(amount)) if amount > 0 else 0


def _gpu_count() -> int:
    if not ray.is_initialized():
        return 0
    return len(ray.get_gpu_ids())


# -- a dataset at once ---------------------------------------------------------------------
