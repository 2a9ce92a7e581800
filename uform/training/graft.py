"""One media tower of a checkpoint written into another (``python -m uform.training.graft``).

Every tower of the recipe learns against the seed's fixed prototypes
(:func:`~uform.training.losses.prototypes`) and a media tower plays no part in ``text_choose``,
so a picture, clip or sound tower of one run means the same in any checkpoint of the same seed:
the tower that read best on the held-out split (:mod:`uform.training.heldout`) can be taken from
the run that made it, as ``--phase pictures`` (:mod:`uform.training.alone`) writes a tower
trained alone. The text tower and the decoder are refused: the choice temperatures were fitted
to them.

    python -m uform.training.graft --tower image --from run.safetensors --into default.safetensors --out new.safetensors

The result holds the ``--from`` checkpoint's tensors of that tower, byte for byte, and every
other tensor and the metadata (configuration, choice temperatures) of ``--into``. Both must be
of the same seed (the checkpoint does not record it) and hold the tower with the same
configuration.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from uform.core import files, safetensors
from uform.core.config import ModelConfig
from uform.core.errors import CheckpointError

TOWERS = ("audio", "image", "video")  # the media towers: each learns against the prototypes alone


def parsed(path: str | os.PathLike[str]) -> tuple[safetensors.Container, ModelConfig]:
    """The checkpoint at ``path``, read whole and checked, and its configuration; errors name the path."""
    try:
        container = safetensors.parse(memoryview(Path(path).read_bytes()))
        return container, ModelConfig.from_metadata(container.metadata)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({exc.strerror or exc})") from None
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def graft(tower: str, source: str | os.PathLike[str], into: str | os.PathLike[str], out: str | os.PathLike[str]) -> int:
    """Write ``into`` with ``source``'s ``tower`` to ``out``; the number of tensors taken."""
    if tower not in TOWERS:
        raise ValueError(f"only a media tower can be grafted ({', '.join(TOWERS)}), not {tower!r}: "
                         "the choice temperatures were fitted to the text tower and the decoder")  # fmt: skip
    (donor, donor_config), (host, host_config) = parsed(source), parsed(into)
    configs = []
    for path, config in ((source, donor_config), (into, host_config)):
        if tower not in config.towers:
            raise CheckpointError(f"{path}: holds no {tower} tower (towers: {', '.join(sorted(config.towers))})")
        configs.append(config.towers[tower])
    if configs[0] != configs[1]:
        raise CheckpointError(f"{source}'s {tower} tower is configured otherwise than {into}'s: {configs[0]} against {configs[1]}")
    prefix = f"{tower}."
    taken = sorted(n for n in donor.entries if n.startswith(prefix))
    kept = sorted(n for n in host.entries if n.startswith(prefix))
    if taken != kept:
        raise CheckpointError(f"{source}'s {tower} tower holds other tensors than {into}'s: "
                              f"{sorted(set(taken) ^ set(kept))[:4]}")  # fmt: skip
    tensors = {n: (donor if n.startswith(prefix) else host).array(n) for n in host.entries}
    files.write_with(out, lambda f: safetensors.write(f, tensors, host.metadata))  # renamed once whole: ``out`` may be ``into`` itself
    return len(taken)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m uform.training.graft", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tower", required=True, choices=TOWERS)
    parser.add_argument("--from", dest="source", required=True, type=Path, help="the checkpoint the tower is taken from")
    parser.add_argument("--into", required=True, type=Path, help="the checkpoint whose other tensors and metadata are kept")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        count = graft(args.tower, args.source, args.into, args.out)
    except (ValueError, files.OutputError) as exc:  # CheckpointError among them; an out not written names itself
        parser.exit(2, f"error: {exc}\n")
    print(f"{args.out}: {args.into} with the {args.tower} tower of {args.source} ({count} tensors)")


if __name__ == "__main__":
    main()
