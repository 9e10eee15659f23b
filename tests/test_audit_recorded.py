"""The decode loops bundled with ds4lab (recorded by ``ds4lab audit validate`` on an H200): the audit of
each, made here without a GPU, agrees with what ``torch.cuda.graph`` did with the same step on that GPU
(the outcome stored beside the recording), and its whole-token plan with the measured replay."""

from __future__ import annotations

import pytest

from ds4lab.audit.analysis import analyze
from ds4lab.audit.engines import RECORDED, TOKEN_RANGE, recorded, recorded_outcome
from ds4lab.audit.frozen import UNKNOWN
from ds4lab.trace.sources import read_events as read
from ds4lab.audit.validate import OUTCOMES, TIME_TOLERANCE, measured_replay, predicted_outcome, waits_per_token


@pytest.fixture(scope="module", params=RECORDED, ids=lambda p: "-".join(p))
def audited(request):
    engine, cache = request.param
    rep = analyze([read(recorded(engine, cache))], token_range=TOKEN_RANGE)[0]
    return rep, recorded_outcome(engine, cache)


def test_the_verdict_names_what_torch_did(audited):
    """The bundled recordings carry no kernel arguments: a step torch replayed right is 'unknown from this
    trace' (with the command that records them), never 'replays right' without that evidence."""
    rep, torch_run = audited
    verdict, because = predicted_outcome(rep)
    if torch_run["outcome"] == "captured, replays right":
        assert verdict == UNKNOWN and "ds4lab audit run" in because, (verdict, because)
    else:
        assert verdict == OUTCOMES[torch_run["outcome"]], (verdict, because, torch_run["detail"])
    assert because, "every verdict names what decides it"


def test_the_whole_token_plan_predicts_the_measured_replay(audited):
    rep, torch_run = audited
    if torch_run["outcome"] == "refused":
        pytest.skip("torch refused the capture: no replay to predict")
    whole = float(rep.plans.set_index("plan").loc["whole token", "predicted_us"])
    replay, loop = measured_replay(torch_run, waits_per_token(rep))
    assert loop.startswith("never waits")  # the recorded steps hold no blocking call: the loop that never waits
    assert abs(whole / replay - 1) <= TIME_TOLERANCE, (whole, replay)


def test_the_recordings_say_where_they_were_made():
    for engine, cache in RECORDED:
        run = recorded_outcome(engine, cache)
        assert run["engine"] == engine and run["cache"] == cache
        assert "H200" in run["device"]["device"] and run["device"]["driver"]
        assert run["eager_us"] > 0


def test_a_pair_that_is_not_bundled_is_named():
    with pytest.raises(ValueError, match="qwen2-moe.*bundled: llama/static"):
        recorded("qwen2-moe", "static")
