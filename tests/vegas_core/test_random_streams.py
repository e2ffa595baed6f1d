"""Counter-based streams: uniform, repeatable, independent across keys, positions and purposes."""
import torch

from vegas_core.random_streams import ACCEPT, DRAFT, TOKEN, stream_key, uniforms


def test_uniforms_are_uniform_in_the_open_interval():
    keys = torch.tensor([stream_key(s) for s in range(64)])
    u = uniforms(keys, torch.arange(64), TOKEN, 16_384).flatten()          # 1M draws
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 2e-3 and abs(float(u.var()) - 1 / 12) < 2e-3
    hist = torch.histc(u, bins=32, min=0, max=1) / u.numel()
    assert float((hist - 1 / 32).abs().max()) < 1e-3
    # Neighbouring columns and rows do not move together.
    grid = u.view(64, 16_384)
    assert abs(float(torch.corrcoef(torch.stack([grid[:, :-1].flatten(), grid[:, 1:].flatten()]))[0, 1])) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([grid[:-1].flatten(), grid[1:].flatten()]))[0, 1])) < 0.01


def test_a_draw_depends_on_key_position_and_purpose_only():
    keys = torch.tensor([stream_key(1), stream_key(2)])
    pos = torch.tensor([10, 10])
    a = uniforms(keys, pos, TOKEN, 8)
    assert torch.equal(a, uniforms(keys, pos, TOKEN, 8))                  # repeatable
    assert torch.equal(a[1:], uniforms(keys[1:], pos[1:], TOKEN, 8))      # not the batch
    assert not torch.equal(a[0], a[1])                                    # key
    assert not torch.equal(a, uniforms(keys, pos + 1, TOKEN, 8))          # position
    draws = [uniforms(keys, pos, tag, 8) for tag in (TOKEN, DRAFT, ACCEPT)]
    assert all(not torch.equal(x, y) for i, x in enumerate(draws) for y in draws[i + 1:])  # purpose
    two_d = uniforms(keys, torch.tensor([[10, 11, 12], [10, 11, 12]]), ACCEPT)
    cols = torch.stack([uniforms(keys, pos + j, ACCEPT, 1)[:, 0] for j in range(3)], dim=1)
    assert torch.equal(two_d, cols)


def test_stream_keys_follow_seeds():
    assert stream_key(7) == stream_key(7) and stream_key(7) != stream_key(8)
    assert stream_key(-1) != stream_key(1)                     # negative seeds are seeds too
    assert stream_key(2 ** 40 + 5) != stream_key(5)            # high bits count
    assert all(0 <= stream_key(s) < 2 ** 32 for s in (0, 1, -3, 2 ** 70))
    torch.manual_seed(0)
    first = [stream_key(None) for _ in range(3)]
    torch.manual_seed(0)
    assert [stream_key(None) for _ in range(3)] == first and len(set(first)) == 3


def test_the_extreme_hashes_stay_inside_the_open_interval():
    """Every hash maps strictly inside (0, 1), the largest too: with 24 bits, (2^24 - 0.5) / 2^24
    rounded to 1.0 in float32, so -log(u) was 0 and the race's w / E NaN or inf (a zero-weight
    token could win)."""
    from vegas_core.random_streams import unit_interval
    top = torch.arange((1 << 32) - 4096, 1 << 32, dtype=torch.int64)       # the largest hashes
    bottom = torch.arange(0, 4096, dtype=torch.int64)
    u = unit_interval(torch.cat([bottom, top]))
    assert float(u.min()) > 0 and float(u.max()) < 1 and float(-torch.log(u).min()) > 0
    assert float(u.max()) == 1 - 2 ** -24 and float(u.min()) == 2 ** -24
    # One more bit would reach 1.0: what the 24-bit form did.
    assert float(((top >> 8).to(torch.float32) + 0.5).max() * (1.0 / (1 << 24))) == 1.0
