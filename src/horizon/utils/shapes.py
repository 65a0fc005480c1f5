"""Compile-shape buckets: jitted functions see a few padded sizes instead of one shape per input."""


def bucket(n: int, minimum: int, *, per_octave: int = 1) -> int:
    """Smallest compile-shape bucket >= max(n, minimum) (the RL trainer's batch rows, the sampler's batch /
    prompt / generation lengths, the rollout engine's attention windows): a power of two, or with
    ``per_octave`` = 2, 4, ... also that many evenly spaced steps per doubling (2: ..., 64, 96, 128,
    192, 256, ...; 4: ..., 128, 160, 192, 224, 256, ...): at most 1 + 1/per_octave times the need
    instead of 2x, for per_octave times the shapes."""
    if per_octave < 1 or per_octave & (per_octave - 1):
        raise ValueError(f"per_octave must be a power of two (1, 2, 4, ...), got {per_octave}")
    n = max(int(n), int(minimum), 1)
    p = 1 << (n - 1).bit_length()
    step = p // (2 * per_octave)
    if per_octave > 1 and step >= 1:
        return p // 2 + step * -(-(n - p // 2) // step)
    return p
