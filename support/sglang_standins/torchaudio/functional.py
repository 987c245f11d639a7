"""torchaudio.functional stand-in: see the package's docstring."""


def resample(*args, **kwargs):
    raise NotImplementedError("torchaudio stand-in: resampling is not available; send 16 kHz audio")
