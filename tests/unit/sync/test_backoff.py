from __future__ import annotations

from sync.subscriber import Backoff


def test_backoff_grows_exponentially_with_jitter_up_to_its_cap() -> None:
    backoff = Backoff(maximum=4.0, base=0.5)
    caps = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    delays = [backoff.next() for _ in caps]
    assert all(0 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    samples = [Backoff(4.0, 0.5) for _ in range(200)]
    for b in samples:
        for _ in range(5):
            b.next()
    jittered = {round(b.next(), 6) for b in samples}
    assert len(jittered) > 150 and max(jittered) <= 4.0  # spread out, never past the cap
    backoff.reset()
    assert backoff.next() <= 0.5
