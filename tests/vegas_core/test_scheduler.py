"""What a decode iteration reserves past the cached tokens (`scheduler.lookahead`), and that the
scheduler reserves it."""
from vegas_core.block_manager import BlockAllocator
from vegas_core.request import Request
from vegas_core.sampling import SamplingParams
from vegas_core.scheduler import Scheduler, lookahead
from vegas_core.spec import SpecParams


def _req(spec, max_tokens=100, temperature=0.0, generated=0):
    r = Request([1] * 10, SamplingParams(max_tokens=max_tokens, temperature=temperature), spec)
    r.token_ids += [2] * generated
    return r


def test_lookahead_per_kind_of_request():
    vegas = _req(SpecParams(method="vegas", gamma=6))
    assert lookahead(vegas, 8) == 1                 # first step: no selection yet, a plain step
    vegas.selection = object()
    assert lookahead(vegas, 8) == 7                 # the pending token and six drafts
    assert lookahead(_req(SpecParams(method="vanilla")), 8) == 8            # chained plain steps
    assert lookahead(_req(SpecParams(method="vanilla"), max_tokens=20, generated=17), 8) == 3
    assert lookahead(_req(SpecParams(method="vanilla"), temperature=0.7), 8) == 8   # sampled chains too
    assert lookahead(_req(SpecParams(method="vanilla")), 1) == 1


def test_scheduler_reserves_the_chained_steps():
    alloc = BlockAllocator(64, 4)
    sched = Scheduler(alloc, max_num_seqs=4, max_prefill_tokens=64, decode_steps=8)
    req = _req(SpecParams(method="vanilla"))
    sched.add(req)
    plan = sched.schedule()
    assert [c.request for c in plan.prefill] == [req]
    req.num_cached = req.prefill_target
    plan = sched.schedule()
    assert plan.decode == [req] and alloc.capacity(req.request_id) >= req.num_cached + 8


def test_the_next_decode_batch_is_certain_only_when_nothing_else_can_run():
    """Run-ahead asks the scheduler for the next decode batch: known only when nothing needs a
    prefill and nothing can join (nothing waits, or the batch is full); `reserve` gives every
    request its next iteration's slots, or none of them."""
    alloc = BlockAllocator(8, 4)
    sched = Scheduler(alloc, max_num_seqs=4, max_prefill_tokens=64, decode_steps=8)
    old, new = _req(SpecParams(method="vanilla")), _req(SpecParams(method="vanilla"))
    sched.add(old)
    sched.schedule()
    assert sched.certain_decode_batch() is None                 # still needs its prefill
    old.num_cached = old.prefill_target
    sched.add(new)
    assert sched.certain_decode_batch() is None                 # a request waits
    plan = sched.schedule()
    new.num_cached = new.prefill_target
    assert sched.certain_decode_batch() == [old, new]           # oldest first
    new.held = True
    assert sched.certain_decode_batch() == [old]
    new.held = False
    free = alloc.num_free
    assert not sched.reserve([old, new]) and alloc.num_free == free   # 2 x 17 slots > 8 pages: none
    assert sched.reserve([old]) and alloc.capacity(old.request_id) >= old.num_cached + 8
    assert sched.schedule().decode[0] is old and plan.prefill
    sched.max_num_seqs = 2                  # the batch is full: a waiting request cannot join
    sched.add(late := _req(SpecParams(method="vanilla")))
    assert sched.certain_decode_batch() == [old, new]
    full = sched.schedule()
    assert not full.prefill and old in full.decode and late in sched.waiting
    sched.remove(new)                       # a place frees up: the next step admits it
    assert sched.certain_decode_batch() is None
