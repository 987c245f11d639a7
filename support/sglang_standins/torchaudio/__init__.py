"""Stand-in for torchaudio (PyPI's build needs a torch other than this project's 2.13 CPU wheel):
SGLang's ``load_audio`` imports it and calls only ``functional.resample``, when the audio's rate
is not 16 kHz. The front always sends 16 kHz WAV, so the stand-in is never called; if it is,
it says so instead of resampling."""
from . import functional

__all__ = ["functional"]

__version__ = "0.0.0+standin"
