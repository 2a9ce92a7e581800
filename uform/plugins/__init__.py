"""uform's built-in plugins, each registered through the ``uform`` entry-point group.

Every module directly in this package is a plugin (``pyproject.toml`` names each one). What
they share lives in subpackages: :mod:`uform.plugins.media` (decoding and preparing what
the modality plugins read), :mod:`uform.plugins.sessions` (session options, replicas,
GPUs and the reference dequantization the backends share) and :mod:`uform.plugins.oplib`
(the op library's binding and the e4m3 backend's graph rewrites).
"""
