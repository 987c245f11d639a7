"""Stand-in for torchvision (no CPU build of it is reachable here): SGLang's import chain reaches
it through transformers' image processors, which the Whisper path never runs. Every name
resolves; calling one raises."""
__version__ = "0.28.0"


def _unavailable(name):
    def call(*args, **kwargs):
        raise NotImplementedError(f"torchvision stand-in: {name} is not available")
    return call


def __getattr__(name):
    return _unavailable(name)
