"""The hooks' on/off state (fastmm/_switch.py): a call turns a hook on for good, a block for its duration, blocks
in threads overlap in any order, and restore turns it off at once."""

from __future__ import annotations

import threading

from fastmm._switch import Hook, Switch


def make():
    log = []
    switch = Switch(lambda: log.append("install"), lambda: log.append("uninstall"))

    class H(Hook):
        _switch, _name = switch, "test hook"

    return switch, H, log


def test_a_call_is_for_good_and_restore_is_at_once():
    switch, H, log = make()
    H()
    H()
    with H():
        pass
    assert switch.active and log == ["install"]
    switch.off()
    switch.off()
    assert not switch.active and log == ["install", "uninstall"]
    assert repr(H()) == "<fastmm test hook: on>"


def test_nested_blocks_and_a_call_inside_a_block():
    switch, H, log = make()
    with H():
        with H():
            pass
        assert switch.active
    assert not switch.active and log == ["install", "uninstall"]
    with H():
        H()  # "from now on", even from inside a block
    assert switch.active
    switch.off()
    with H():
        switch.off()  # restore inside a block: off at once, and the block's exit does not turn it on again
        assert not switch.active
    assert not switch.active and log == ["install", "uninstall"] * 3


def test_overlapping_blocks_in_threads_leave_it_on_until_the_last_exit():
    switch, H, log = make()
    gate = threading.Barrier(8)
    order = []

    def block(i):
        with H():
            gate.wait()
            order.append(switch.active)

    threads = [threading.Thread(target=block, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order == [True] * 8 and not switch.active and log == ["install", "uninstall"]


def test_a_plain_call_between_another_threads_call_and_its_block_is_kept():
    """Thread A: `with H():` is on() then enter(); thread B's plain on() may come in between."""
    switch, H, log = make()
    switch.on()      # A's call
    switch.on()      # B's plain call: for good
    switch.enter()   # A's block opens
    switch.exit()    # ... and closes
    assert switch.active and log == ["install"]
    switch.off()
    assert log == ["install", "uninstall"]
