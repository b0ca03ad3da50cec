"""omniwalk: serving for composite any-to-any multimodal models. ``from omniwalk import Omni``."""

__all__ = ["Omni"]


def __getattr__(name: str):
    # Lazy: importing the package (e.g. for the CLI or config) must not pull in torch models.
    if name == "Omni":
        from omniwalk.omni import Omni

        return Omni
    raise AttributeError(f"module 'omniwalk' has no attribute {name!r}")
