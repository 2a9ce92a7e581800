"""The errors fastermodels raises."""


class SpecError(ValueError):
    """A rebuild spec that does not fit its source model (unknown module, type or argument)."""


class WeightsMismatchError(RuntimeError):
    """Weights that disagree with the model's keys or shapes; nothing was loaded."""


class ArtifactNotFoundError(FileNotFoundError):
    """An artifact publishes none of the forms asked for."""


class UntrustedSourceError(ImportError):
    """An artifact's ``source`` lies outside the model zoos loaded by default; nothing was imported."""
