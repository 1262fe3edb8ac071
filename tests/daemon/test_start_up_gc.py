"""Once started, the daemon keeps its start-up heap out of the garbage collector's
walks and collects the young generation less often (mailer/daemon/app.py, #41)."""

from __future__ import annotations

import gc

from fairpost.mailer.daemon import app


def test_start_up_is_frozen_and_young_objects_are_collected_less_often() -> None:
    before = gc.get_threshold()
    try:
        app._freeze_start_up()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (app.YOUNG_COLLECTION_THRESHOLD, *before[1:])
        assert before[0] < app.YOUNG_COLLECTION_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
