"""The errors fastermodels raises."""


class SpecError(ValueError):
    """A source and rebuild spec that do not build: the factory refuses its source_kwargs, or the spec
    does not fit the source model (unknown module, type or argument)."""


class WeightsMismatchError(RuntimeError):
    """Weights that disagree with the model's keys or shapes; nothing was loaded."""


class ArtifactNotFoundError(FileNotFoundError):
    """An artifact publishes none of the forms asked for."""


class ArtifactReadError(ValueError):
    """A file of the artifact is not what its name says (a config.json that is not a JSON object,
    a corrupt safetensors or TorchScript file); the message names the file and the reason."""


class UntrustedSourceError(ImportError):
    """Loading would run code the caller has not trusted: a ``source`` that is not a registered zoo
    builder, ``source_kwargs`` that would fetch or load something, or a TorchScript file. Nothing
    was imported, fetched or run; ``trust_remote_code=True`` says the caller trusts it."""
