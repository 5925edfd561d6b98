"""Resampling is deliberately unsupported: reference fixtures feed audio at the model's own rate."""


def resample(waveform, orig_freq, new_freq, *args, **kwargs):
    if orig_freq == new_freq:
        return waveform
    raise NotImplementedError(f"fixture audio must already be at the model rate ({orig_freq} != {new_freq})")
