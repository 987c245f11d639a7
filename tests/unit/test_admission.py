"""Backpressure bookkeeping, and its use while an upload decodes."""

import time

import numpy as np
import pytest

from asr_service.audio import decode_audio
from asr_service.server.admission import Admission, AdmissionLimits, Overloaded
from tests.helpers import encode

pytestmark = pytest.mark.unit


def test_one_request_alone_is_admitted_however_much_audio_it_decodes_into():
    admission = Admission(AdmissionLimits(max_pending_requests=4, max_pending_audio_seconds=60))
    ticket = admission.admit()
    ticket.claim(3 * 3600)
    assert admission.pending_audio_seconds == 3 * 3600
    ticket.release()
    ticket.release()  # twice is harmless
    assert admission.pending_requests == 0 and admission.pending_audio_seconds == 0


def test_a_ticket_that_grows_past_the_bound_beside_other_work_is_refused():
    admission = Admission(AdmissionLimits(max_pending_requests=4, max_pending_audio_seconds=60))
    running = admission.admit(40)
    growing = admission.admit()
    growing.claim(10)
    growing.claim(5)  # a claim never shrinks the ticket
    assert admission.pending_audio_seconds == 50
    with pytest.raises(Overloaded) as e:
        growing.claim(30)
    assert "60" in str(e.value) and e.value.retry_after >= 1
    growing.release()
    assert admission.pending_requests == 1 and admission.pending_audio_seconds == 40
    running.release()


def test_the_decode_reports_its_progress_and_stops_when_told():
    data = encode("wav", "pcm_s16le", seconds=35.0, rate=16000, layout="mono")
    heard = []
    assert decode_audio(data, on_progress=heard.append).shape[0] == 35 * 16000
    assert len(heard) >= 3 and heard == sorted(heard) and 10 <= heard[0] < 11

    def refuse(seconds):
        raise Overloaded("full", 1)

    with pytest.raises(Overloaded):
        decode_audio(data, on_progress=refuse)


def test_the_decode_stops_at_its_deadline():
    data = encode("wav", "pcm_s16le", seconds=25.0, rate=16000, layout="mono")
    with pytest.raises(TimeoutError):
        decode_audio(data, deadline=time.monotonic() - 1)
    assert np.isfinite(decode_audio(data, deadline=time.monotonic() + 60)).all()
