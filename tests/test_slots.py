"""The slot registry's rules, as plain function calls."""

import pytest

from pytest_hud.sim.slots import SlotError, SlotRegistry, SlotState


def test_tokens_are_unguessable_and_unique():
    reg = SlotRegistry(4)
    tokens = {reg.claim(1, {"seed": i}).token for i in range(4)}
    assert len(tokens) == 4 and all(len(t) == 32 for t in tokens)  # 128 bits of hex


def test_a_full_registry_refuses_claims_until_a_slot_is_released():
    reg = SlotRegistry(1)
    slot = reg.claim(1, {})
    with pytest.raises(SlotError, match="no free slot"):
        reg.claim(1, {})
    reg.release(slot)
    assert reg.claim(2, {}).index == 0


def test_closing_an_owner_releases_only_its_claims():
    reg = SlotRegistry(3)
    a, b = reg.claim(1, {}), reg.claim(2, {})
    released = reg.release_owner(1)
    assert [s.index for s in released] == [a.index]
    assert a.state is SlotState.FREE and b.state is SlotState.CLAIMED
    with pytest.raises(SlotError, match="unknown or released"):
        reg.by_token(a.token or "x")


def test_a_none_claim_binds_only_an_unambiguous_slot():
    reg = SlotRegistry(2)
    one = reg.claim(1, {})
    assert reg.resolve_claim(None) is one
    reg.claim(1, {})
    with pytest.raises(SlotError, match="exactly one"):
        reg.resolve_claim(None)


def test_ticks_wait_for_every_live_slot():
    reg = SlotRegistry(2)
    a, b = reg.claim(1, {}), reg.claim(1, {})
    assert not reg.ready_to_step()  # nothing live
    a.state = b.state = SlotState.LIVE
    a.pending_action = 1
    assert not reg.ready_to_step()
    b.pending_action = 0
    assert reg.ready_to_step()
